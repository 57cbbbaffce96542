"""How far a second measurement of the same config (the store's `repeats`, another process) is from the first,
by the config's time, and how many of a kernel's judged held-out-shape cases sit under 2 us (session 28, swiglu).

    python notes/experiments/s28_repeat_noise.py [STORE] [KERNEL]   (default /work/bench/committed.duckdb swiglu)
"""
import sys

import duckdb

store = sys.argv[1] if len(sys.argv) > 1 else "/work/bench/committed.duckdb"
kernel = sys.argv[2] if len(sys.argv) > 2 else "swiglu"
con = duckdb.connect(store, read_only=True)
keys = "device_id, kernel, kernel_version, dtype, shape_key, config_key"
print(con.sql(f"""
    select r.device_id,
           case when m.median_us < 2 then 'a: under 2 us' when m.median_us < 5 then 'b: 2-5 us'
                when m.median_us < 20 then 'c: 5-20 us' else 'd: 20 us and up' end as bucket,
           count(*) as configs,
           median(abs(r.median_us - m.median_us) / least(r.median_us, m.median_us)) as median_diff,
           quantile_cont(abs(r.median_us - m.median_us) / least(r.median_us, m.median_us), 0.9) as p90_diff
    from repeats r join measurements m using ({keys})
    where m.kernel = ? and m.status = 'ok' group by all order by 1, 2""", params=[kernel]))
print(con.sql("""
    with cases as (select device_id, dtype, shape_key, min(median_us) as best from measurements
                   where kernel = ? and status = 'ok' and device_id in ('nvidia-h100-sxm', 'nvidia-h200') group by all)
    select device_id, count(*) as cases, count(*) filter (where best < 2) as best_under_2us,
           count(*) filter (where best < 5) as best_under_5us from cases group by 1 order by 1""", params=[kernel]))
