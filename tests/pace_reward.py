"""A reward of 0 that takes 50 ms a call: it paces the trainer so that a test can stop or kill it
between chosen steps on a machine of any speed (a quiet CPU trains tiny-arith at ~20 steps/s).
Adding 0 to every completion's reward changes no advantage."""

import time


def pace(completions, **kwargs):
    time.sleep(0.05)
    return [0.0] * len(completions)
