"""What a tunable kernel is, and launching, checking and timing one config (see ARCHITECTURE.md)."""
