"""The first SIGINT raises KeyboardInterrupt; the ones right after it are ignored.

`timeout -s INT` (how bench/gpu_suite.sh stops a section at its cap) signals its command and then the command's whole
process group, so a benchmark script often receives SIGINT twice within microseconds. The second would interrupt the
`except KeyboardInterrupt` block that writes the script's JSON, and the rows it reached would be lost. Every section
script calls `install()` when run as a program (not on import, so a test that imports one keeps its own handler).
"""
import signal


def install():
    "SIGINT: KeyboardInterrupt the first time, nothing after (the SIGKILL that `timeout -k` sends later still ends it)."
    fired = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
