"""What runs once, when each rank's scheduler installs our sizer (`install`, the startup hook): every rank's
settings agreed (`consensus`, under a `deadline`), the cost model resolved from a profile, the cache or a
calibration (`profiles`, `calibrate` on the one timed forward of `harness`, keyed by `cache_key`), SGLang's
kernel switches read (`switches`), the per-chunk overhead probed in the pipeline (`overhead`) and the plans'
chunks measured where the calibration did not reach (`coverage`). Imports serving, pd and compat below it."""
