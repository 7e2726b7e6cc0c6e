"""How a run ends and how its timing is judged, without Lightning: the errors that end a run, the signal
exceptions, and the step-time spread above which a run is noisy. Here, not beside the Lightning callbacks
that raise or read them (harness.reliability, harness.throughput), so the command lines' refusals, the
resume request and the study's report import them without loading Lightning (seconds at every start).
"""

from __future__ import annotations

#: p90 / p50 of a run's step times above which it is flagged noisy.
NOISY_SPREAD = 1.10


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (the message names the step, method, last finite loss)."""


class StopNow(BaseException):
    """A second SIGINT/SIGTERM: stop at once. Not a KeyboardInterrupt, which Lightning answers with
    ``sys.exit(1)`` before the run can record itself; not an Exception, which code on the way out could
    take for an error of the run."""


class Interrupted(KeyboardInterrupt):
    """A run (or a study) stopped by a signal, with what it finished recorded: the command lines exit 130."""


class OutputDirError(OSError):
    """The run directory cannot be created or written."""
