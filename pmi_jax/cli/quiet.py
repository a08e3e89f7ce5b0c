"""What a command prints on stderr: its own messages and real warnings, not its libraries' start-up.

TensorFlow, JAX and Orbax announce themselves on every start (no CUDA driver, no TPU backend,
handler registrations), which buries the command's output; `pmi-jax --verbose` shows it all.
Two filters: `configure_logging` for Python logging (ours from INFO, other libraries from
WARNING minus known start-up messages), and `filter_stderr` for C++ logging written straight to
fd 2, piped through a small forked process (not a thread, so a fatal error's last words still
reach the terminal). Details: docs/design.md, "Module notes", quiet.py.
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import signal
import sys
import threading
import time

# A line of absl / glog C++ logging: severity letter, MMDD, time, thread id, file:line].
_CXX_LOG_LINE = re.compile(rb"^[IWEF]\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
_CXX_INFO_LINE = re.compile(rb"^I\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
# Start-up lines that say nothing to a user, whatever their severity.
_NOISE = re.compile(rb"|".join([
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    rb"failed call to cuInit",
    rb"Could not find cuda drivers",
    rb"Unable to register cu(DNN|FFT|BLAS) factory",
    rb"computation placer already registered",
    rb"TF-TRT Warning: Could not find TensorRT",
    rb"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
    rb"cpu_feature_guard\.cc",
]))
# The longest a held-back partial line may be before it is passed on anyway.
_MAX_HELD = 1 << 16
# Python loggers whose INFO records are the command's own messages.
_OWN_LOGGERS = ("root", "pmi_jax", "preprocess", "__main__")
_NOISY_MESSAGES = re.compile(r"Unable to initialize backend|Type handler registry .*overriding|"
                             r"An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib")


def is_noise(line: bytes) -> bool:
    """Whether a line written to stderr is library start-up chatter (without its newline)."""
    return bool(_CXX_INFO_LINE.match(line) or _NOISE.search(line))


class _QuietFilter(logging.Filter):
    """Passes the project's records from INFO up and other libraries' real warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name in _OWN_LOGGERS or record.name.split(".")[0] in _OWN_LOGGERS
        if not own and record.levelno < logging.WARNING:
            return False
        return own or not _NOISY_MESSAGES.search(record.getMessage())


def verbose_requested(argv: list[str]) -> bool:
    """Whether `--verbose` is among the options before the command (read before the parser is built)."""
    return "--verbose" in itertools.takewhile(lambda arg: arg.startswith("-"), argv)


def configure_logging(verbose: bool) -> None:
    """Log to stderr as `HH:MM:SS LEVEL message`; without `verbose`, only what `_QuietFilter` passes."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    if not verbose:
        handler.addFilter(_QuietFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # what TensorFlow's C++ logging does honour


def _filter_loop(read_fd: int, write_fd: int) -> None:
    """Copy read_fd to write_fd line by line, dropping noise; runs in the forked filter process."""
    held = b""
    while True:
        try:
            chunk = os.read(read_fd, 1 << 16)
        except InterruptedError:
            continue
        if not chunk:
            break
        held += chunk
        *lines, held = held.split(b"\n")
        out = b"".join(line + b"\n" for line in lines if not is_noise(line))
        # A partial line goes on at once (progress bars redraw with \r and no newline) unless it
        # may be the start of a C++ log line or of the absl banner, which are judged whole.
        if held and (len(held) > _MAX_HELD or not (held[:1] in b"IWEF" or held.startswith(b"WARNING"))):
            out, held = out + held, b""
        if out:
            _write_all(write_fd, out)
    if held and not is_noise(held):
        _write_all(write_fd, held)


def _pass_on(command: int, signum: int, frame) -> None:
    """In the filter process: send a signal it received to the command it filters for."""
    try:
        os.kill(command, signum)
    except OSError:  # the command has ended: nothing to stop
        pass


_FROM_THE_TERMINAL = 0x80  # si_code SI_KERNEL: Ctrl-C, which the terminal sends the whole process group


def _pass_on_interrupts(command: int) -> None:
    """In the filter process, a thread: pass on each SIGINT sent to the filter alone.

    SIGINT is blocked in the filter and taken here with its sender's details. Ctrl-C at the
    terminal (si_code SI_KERNEL) has reached the command too and is not passed on, so an
    interrupt arrives once; a `kill -INT` (SI_USER) is meant for this command line and is.
    """
    while True:
        received = signal.sigwaitinfo({signal.SIGINT})
        if received.si_code != _FROM_THE_TERMINAL:
            _pass_on(command, signal.SIGINT, None)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:  # the terminal went away: nothing left to show it to
            return


class StderrFilter:
    """fd 2 through `_filter_loop` in a forked process until `close()`."""

    def __init__(self):
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        command = os.getpid()
        # The filter is born with these signals blocked: one sent between the fork and its
        # handlers (as soon as `self.pid` is known) waits for them instead of killing it.
        passed_on = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
        blocked_before = signal.pthread_sigmask(signal.SIG_BLOCK, passed_on)
        try:
            self.pid = os.fork()
        finally:
            if os.getpid() == command:  # the command (also when fork failed): its signals as they were
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked_before)
        if self.pid == 0:  # the filter process: original stderr on fd 2, the pipe on read_fd
            # The filter outlives the command, which may still have things to say after a
            # signal, and ends at EOF, when the command and its children have closed the pipe.
            # It runs under the command's own command line, so `pkill -n pmi-jax` or a
            # scheduler may signal it alone: it passes SIGTERM, SIGHUP and SIGINT on to the
            # command (`train` checkpoints on SIGTERM and SIGINT, and treats a second one sent
            # to the whole group as the same request); Ctrl-C, which the command gets from the
            # terminal itself, is not passed on (`_pass_on_interrupts`).
            for signum in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, functools.partial(_pass_on, command))
            if hasattr(signal, "sigwaitinfo"):  # SIGINT stays blocked, for the thread to take
                threading.Thread(target=_pass_on_interrupts, args=(command,), daemon=True).start()
                passed_on.discard(signal.SIGINT)
            else:  # (macOS) a sender cannot be told from the terminal: Ctrl-C reaches the command itself
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, passed_on)
            os.close(write_fd)
            try:
                _filter_loop(read_fd, 2)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.saved_fd = os.dup(2)
        os.dup2(write_fd, 2)
        os.close(write_fd)

    def close(self, timeout: float = 5.0) -> None:
        """Give fd 2 back and wait (a little) for the filter to pass on what it holds, so that the
        command's last lines come before the shell's prompt."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.saved_fd, 2)  # our end of the pipe closes; child processes may still hold one
        os.close(self.saved_fd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)


def filter_stderr() -> StderrFilter | None:
    """Start filtering fd 2; None where the platform cannot fork."""
    if not hasattr(os, "fork"):
        return None
    return StderrFilter()


def quiet_checkpoint_reads() -> None:
    """Orbax narrates every read-only restore through absl at INFO and WARNING ("read_only=True,
    setting max_to_keep=None", "Given directory is read only"): routine for commands that only
    read checkpoints (eval, compare, export), so they keep absl to errors."""
    logging.getLogger("absl").setLevel(logging.ERROR)
