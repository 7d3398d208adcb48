"""What SGLang's scheduler sums about its own steps, as the simulator's scheduler does too:
`gen_throughput` (its decode log's tokens a second), the decode moments and the prefill busy
time that `/v1/loads` reports."""

from __future__ import annotations

DECODE_LOG_INTERVAL = 40  # decode steps between SGLang's decode stats (gen_throughput)


class StepStats:
    def __init__(self) -> None:
        self.generated_total = 0
        self.gen_throughput = 0.0  # tokens a second over the last DECODE_LOG_INTERVAL steps
        # steps, and the sums of batch, step time (us), batch squared, batch times step
        # time, and tokens generated: SGLang's `decode_moments`
        self.decode_moments = [0.0] * 6
        self.prefill_busy_us = 0
        self.prefill_uncached_total = 0
        self._log_steps, self._log_at, self._log_generated = 0, 0.0, 0

    def idle(self, now: float) -> None:
        """An idle spell ended: it is not decode time."""
        self._log_steps, self._log_at = 0, now

    def prefilled(self, tokens: int, busy_s: float) -> None:
        self.prefill_busy_us += int(busy_s * 1e6)
        self.prefill_uncached_total += tokens

    def decoded(self, batch: int, busy_s: float, generated: int, now: float) -> None:
        size, step_us = float(batch), busy_s * 1e6
        for i, value in enumerate((1.0, size, step_us, size * size, size * step_us,
                                   float(generated))):  # fmt: skip
            self.decode_moments[i] += value
        self._log(now)

    def _log(self, now: float) -> None:
        """gen_throughput as SGLang's scheduler logs it: the tokens generated over the last
        DECODE_LOG_INTERVAL decode steps (prefill steps among them count in the time)."""
        self._log_steps += 1
        if self._log_steps < DECODE_LOG_INTERVAL:
            return
        if now > self._log_at:
            tokens = self.generated_total - self._log_generated
            self.gen_throughput = tokens / (now - self._log_at)
        self._log_steps, self._log_at, self._log_generated = 0, now, self.generated_total
