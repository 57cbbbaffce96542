"""The report: figures (figures.py), the HTML page (page.py) and the folder they are written to (build.py),
from the data of models/report.py."""
