"""An engine's decode step as a line in its batch, fitted to its gauges."""

from __future__ import annotations

from dataclasses import dataclass

STEP_ALPHA = 0.05  # weight of a poll in a worker's step line
STEP_MIN_SPREAD = 2.0  # requests: a batch that has varied less than this gives no slope


@dataclass
class StepLine:
    """An engine's time per token of each running answer as a line in its batch: a base step,
    plus what each running request adds to it (its KV cache read each step, its sampling),
    fitted to the engine's gauges as its batch comes and goes (exponentially weighted least
    squares). Each request a worker takes makes every token of the batch it joins slower."""

    batch: float = 0.0  # the weighted means of the batch, the step, and their products
    step: float = 0.0
    batch2: float = 0.0
    cross: float = 0.0
    seen: int = 0

    def observe(self, batch: int, step_s: float) -> None:
        if batch <= 0 or step_s <= 0:
            return
        a = max(STEP_ALPHA, 1 / (self.seen + 1))  # the first polls weigh in fully
        self.batch += a * (batch - self.batch)
        self.step += a * (step_s - self.step)
        self.batch2 += a * (batch * batch - self.batch2)
        self.cross += a * (batch * step_s - self.cross)
        self.seen += 1

    def slope(self) -> float | None:
        """Seconds a step grows by for each request in the batch; None: not known yet."""
        spread = self.batch2 - self.batch**2
        if spread < STEP_MIN_SPREAD**2:
            return None
        slope = (self.cross - self.batch * self.step) / spread
        return min(max(0.0, slope), self.step / max(self.batch, 1.0))  # the base is not < 0
