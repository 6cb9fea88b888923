"""An interactive bash inside a running container, on this process's terminal (run by a harness venv's Python).

Usage: python docker_shell.py CONTAINER WORKDIR USER [-i]   (USER: "uid:gid" the shell runs as)
OpenHands' terminal tool starts its shell (`shell_path -i`) on a pseudo-terminal it drives (prompt metadata in
PS1, Ctrl-C, soft timeouts). Given this as the shell, the session it drives is a `bash -i` on a TTY inside the
sandbox container (Docker API exec with tty): every command runs there, with the state of a persistent shell.
Like `docker exec -it`, the local terminal goes raw so that keys (Ctrl-C included) reach the container's TTY.
Exits when either side closes. No network of its own: DOCKER_HOST is the rollout's engine.
"""

import os
import select
import signal
import sys
import termios
import tty

import docker
from sandbox_exec import exec_stream

FORWARDED_ENV = ("PS1", "PS2", "TERM", "GIT_PAGER", "PAGER")


def main() -> int:
    # Raw before anything else (TCSANOW: the harness may already have typed its set-up line, keep it).
    if os.isatty(0):
        tty.setraw(0, termios.TCSANOW)
    container, workdir, user = sys.argv[1], sys.argv[2], sys.argv[3]
    api = docker.from_env(timeout=None).api
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    exec_id = api.exec_create(container, ["bash", "-i"], stdin=True, tty=True, workdir=workdir,
                              environment=env, user=user)["Id"]
    connection = exec_stream.ExecStream(api, exec_id, tty=True)
    remote = connection.socket
    os.write(1, connection.pending())  # the shell's first output, read with the engine's reply
    # Bash >= 5.1 wraps each prompt in bracketed-paste escapes; OpenHands' usual terminals (tmux panes) never show
    # them to the model, so they are turned off before the harness's own set-up line runs.
    remote.sendall(b"bind 'set enable-bracketed-paste off' 2>/dev/null\n")
    # OpenHands interrupts by signalling the shell's process group: pass it on as the key, as a terminal would.
    signal.signal(signal.SIGINT, lambda *_: remote.sendall(b"\x03"))
    while True:
        try:
            ready, _, _ = select.select([0, remote], [], [])
            if 0 in ready:
                data = os.read(0, 65536)
                if not data:
                    return 0
                remote.sendall(data)
            if remote in ready:
                data = remote.recv(65536)
                if not data:
                    return 0
                os.write(1, data)
        except InterruptedError:
            continue
        except OSError:  # the terminal or the container went away
            return 0


if __name__ == "__main__":
    sys.exit(main())
