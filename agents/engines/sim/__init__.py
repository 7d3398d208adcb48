"""An SGLang-compatible simulator: same HTTP API and metrics, a calibrated cost model."""
