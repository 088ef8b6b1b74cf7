"""What a run says while it trains: console log lines (`console`), the step log and its sinks
(`steplog`, `sinks`), the progress bar (`progress`) and step timing (`timing`)."""
