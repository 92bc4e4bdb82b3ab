"""What runs servers and measures them: the TTFT client, the HTTP client, the server launcher, the
experiment runner and its report, and `bench serve`. Imports the core and the what-if models (the
report puts the simulator's prediction beside each measured row)."""
