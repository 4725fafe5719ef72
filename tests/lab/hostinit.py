"""PID 1 of a lab host: reaps every orphan so no zombie piles up, and keeps the host alive."""

import os
import signal
import sys

# Blocked SIGCHLD stays pending, so a child dying between two waits is never missed.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
sys.stdout.write(f"init of {sys.argv[1] if len(sys.argv) > 1 else 'lab host'} up\n")
sys.stdout.flush()
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass
    except ChildProcessError:
        pass
    signal.sigtimedwait({signal.SIGCHLD}, 5.0)
