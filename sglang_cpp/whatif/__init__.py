"""Models of time: the pipeline simulator, the analytic and roofline models and their fit on measured
TTFTs, the serving simulator and its result type, and workloads. Imports only the core: a what-if never
needs a server."""
