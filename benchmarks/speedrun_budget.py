"""Track 2's clock: how many steps fit in a time budget, re-planned after every step.

``BudgetPlan`` is the arithmetic; ``check_budget`` refuses a budget that cannot be a run;
``budget_callback`` is what ``speedrun.py --budget`` hangs on the trainer.

``speedrun.py --budget SECONDS`` trains until the budget (counted from the process's start, as
track 1's wall time is) and scores the whole validation split at the end. Its schedule is the
preset's warmup-stable-decay in steps, so the number of steps must be known before the decay
starts, and be right when it ends: this planner decides it from the clock. After every step it
sets the run's ``max_iters`` to the steps done plus the steps that still fit before the
deadline (the budget less the final check's estimated cost), at the mean time of the last
``window`` steps. A machine that slows by 20% mid-run moves the end earlier, and the decay,
defined on the current plan, still reaches its end at the last step: it is never cut short,
only its slope changes by the steps the plan moved (``tests/test_speedrun_budget.py``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from gptblock.errors import UserValueError
from gptblock.train.evaluate import validation_loss

__all__ = ["BudgetPlan", "budget_callback", "check_budget"]


class BudgetPlan:
    """The planned total steps of a run that must end by ``deadline``.

    Args:
        deadline: when the last step must have ended (``time.time()`` seconds).
        window: how many of the latest step times the mean is taken over: short enough to
            follow a machine whose speed drifts, long enough to average out one slow step.
        skip: the first steps, which allocate and warm the kernels, are not timed.

    Example:
        >>> plan = BudgetPlan(deadline=100.0, window=4, skip=1)
        >>> for step, now in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
        ...     total = plan.after_step(step, now)
        >>> total  # 1 s a step, 96 s left at step 4: 100 steps in all
        100
    """

    def __init__(self, deadline: float, *, window: int = 50, skip: int = 5) -> None:
        self.deadline = deadline
        self.skip = skip
        self.times: collections.deque[float] = collections.deque(maxlen=window + 1)

    def step_seconds(self) -> float | None:
        """The mean time of the latest steps; None before two timed steps have ended."""
        if len(self.times) < 2:
            return None
        return (self.times[-1] - self.times[0]) / (len(self.times) - 1)

    def after_step(self, step: int, now: float) -> int | None:
        """The planned total after ``step`` steps ended at ``now``: ``step`` itself when the
        next step would end past the deadline; None while too few steps are timed."""
        if step >= self.skip:
            self.times.append(now)
        dt = self.step_seconds()
        if dt is None:
            return None
        return step + max(0, math.floor((self.deadline - now) / dt))


CHECK_SHARE = 16  # the final check's cost is estimated on 1/16 of the validation windows
CHECK_MARGIN = 1.1  # ... and taken 10% dearer, for the machine's drift
WARM = 5  # steps before the check's cost is estimated and the clock starts planning


def check_budget(args: argparse.Namespace, started: float) -> None:
    """Refuse a --budget that cannot be a run, before anything is built."""
    if args.baseline or args.check_at:
        flag = "--baseline" if args.baseline else "--check-at"
        raise UserValueError(f"--budget is track 2's own run: it does not take {flag}")
    elapsed = time.time() - started
    if not math.isfinite(args.budget) or args.budget <= elapsed:
        raise UserValueError(
            f"--budget must be a finite number of seconds above the {elapsed:.1f} s the process "
            f"has already run, got {args.budget}"
        )


def budget_callback(
    run: Any, budget: float, started: float, check: Callable[[int], float], plan: dict[str, Any]
) -> Callable[[object], None]:
    """Track 2's on_step_end: plan the steps by the clock, and score the split at the last.

    After ``WARM`` steps, the final check's cost is estimated; from then on ``BudgetPlan``
    re-plans the run's ``max_iters`` after every step (the trainer reads its config at each
    step's learning rate), and the step that the plan says is the last is scored.
    """
    trainer, T = run.trainer, run.train_config.block_size
    end = started + budget
    planner: BudgetPlan | None = None

    def on_step(_: object) -> None:
        nonlocal planner
        step, now = trainer.iter_num, time.time()
        if planner is None:
            if step < WARM:
                return
            # A share of the windows in float32, as the check scores them, twice: the first
            # call's one-off costs (allocations, the float32 kernels' first use) are not the
            # check's. The second, scaled to all the windows.
            part = run.splits.val[: len(run.splits.val) // CHECK_SHARE]
            for _ in range(2):
                timed = time.time()
                validation_loss(run.model, part, block_size=T, batch_size=64, device=trainer.device)
            cost = (time.time() - timed) * CHECK_SHARE * CHECK_MARGIN
            plan.update(check_estimate_seconds=cost, plans=[])
            planner = BudgetPlan(end - cost, skip=step + 1)
            if planner.deadline <= time.time():
                raise UserValueError(
                    f"--budget {budget:g} s leaves no time to train: {step} steps ended "
                    f"{now - started:.1f} s after the process's start, and the final check "
                    f"needs about {cost:.1f} s"
                )
            return
        total = planner.after_step(step, now)
        if total is None:
            total = step if now >= planner.deadline else None
        if total is None:
            return
        if step % 100 == 0 or total <= step:
            plan["plans"].append({"step": step, "planned_steps": total, "seconds": now - started})
        if total <= step:
            check(step)
            trainer.request_stop()
        else:
            trainer.config = dataclasses.replace(trainer.config, max_iters=total)

    return on_step
