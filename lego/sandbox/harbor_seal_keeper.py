"""The keeper's side of the sealed reward channel (lego/sandbox/harbor_seal.py says why it is sound).

Run inside the grading sandbox as the keeper (`python3 -c <this file> <config>`), beside test.sh, in its PID
namespace. It holds a read lease on each reward file it guards, so that every open of one for writing blocks in
the kernel until the keeper lets it through. At each such open (a round) it: records who is opening (the
lease's blocked breakers in /proc/locks); keeps the inode being opened as a session file in its own directory
and puts a fresh leased inode at the path, so that later opens start a round of their own; in `seal` mode asks
Lego to kill every process but test.sh (pid 1) and waits until /proc shows none left; writes the round to the
manifest; and only then releases the lease, so that the blocked open (test.sh's, if any) completes.

Standard library only and kept to Python 3.6: it runs on the task image's python3. Its lines to Lego start with
the marker from the config; the manifest in its directory is the record the grader reads afterwards.
"""

import fcntl
import json
import os
import signal
import sys
import time

F_SETLEASE, F_GETLEASE = 1024, 1025  # linux/fcntl.h: older Pythons do not name them


def main():
    config = json.loads(sys.argv[1])
    directory, store, names = config["directory"], config["store"], config["names"]
    seal = config["mode"] == "seal"
    marker = config["marker"]
    me, keeper = os.getpid(), os.getuid()
    os.umask(0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})  # a lease break is taken with sigtimedwait
    manifest = os.fdopen(os.open(os.path.join(store, config["manifest"]), os.O_CREAT | os.O_WRONLY | os.O_APPEND,
                                 0o600), "a")

    def say(event, **fields):
        fields["event"] = event
        line = json.dumps(fields, sort_keys=True)
        manifest.write(line + "\n")
        manifest.flush()
        sys.stdout.write(marker + line + "\n")
        sys.stdout.flush()

    def read(path, limit=4096):
        with open(path, "rb") as handle:
            return handle.read(limit)

    def lease_lines(fd):
        """Our lease on fd's inode in /proc/locks, and the pids blocked opening it (the breakers)."""
        info = os.fstat(fd)
        key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
        ours, breakers = set(), []
        with open("/proc/locks") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "->" and parts[0] in ours and parts[2] == "LEASE":
                    breakers.append(int(parts[5]))
                elif len(parts) >= 6 and parts[1] == "LEASE" and parts[5] == key and parts[4] == str(me):
                    ours.add(parts[0])
        return bool(ours), breakers

    def describe(pid):
        try:
            stat = read(f"/proc/{pid}/stat").decode("utf-8", "replace")
            command = read(f"/proc/{pid}/cmdline", 300).replace(b"\0", b" ").decode("utf-8", "replace")
            return {"pid": pid, "ppid": int(stat.rsplit(")", 1)[1].split()[1]), "cmd": command.strip()}
        except (OSError, IndexError, ValueError):
            return {"pid": pid, "gone": True}

    def alive_others():
        """Every process of the namespace but test.sh (pid 1) and the keeper's own with a thread not yet dead."""
        alive = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or entry == "1":
                continue
            try:
                status = read(f"/proc/{entry}/status").decode("utf-8", "replace")
                uid = int(status.split("\nUid:", 1)[1].split()[0])
                if uid == keeper:
                    continue
                states = [read(f"/proc/{entry}/task/{task}/stat").rsplit(b")", 1)[1].split()[0]
                          for task in os.listdir(f"/proc/{entry}/task")]
            except (OSError, IndexError, ValueError):
                if os.path.exists("/proc/" + entry):  # there, but unreadable: count it as alive
                    alive.append(int(entry))
                continue
            if any(state not in (b"Z", b"X") for state in states):
                alive.append(int(entry))
        return alive

    def helpers():
        """What test.sh itself keeps running (a process whose parent is outside the namespace came through the
        engine's exec: Lego's own)."""
        return [info for info in map(describe, alive_others()) if info.get("ppid", 0) != 0]

    def fresh(name):
        """A new empty inode, dated 1970 (a write redates it), leased, then put at the path in one rename."""
        spare = os.path.join(store, "." + name + ".new")
        fd = os.open(spare, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC, 0o622)
        os.utime(spare, (0, 0))
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
        os.rename(spare, os.path.join(directory, name))
        return fd

    try:
        break_s = float(read("/proc/sys/fs/lease-break-time").strip() or 45)
    except (OSError, ValueError):
        break_s = 45.0
    budget = min(float(config["round_s"]), break_s / 2)

    def clear(fd):
        """Until only test.sh is left: ask Lego to kill the rest, and check /proc."""
        asked = None
        deadline = time.monotonic() + budget
        while True:
            others = alive_others()
            if not others:
                break
            now = time.monotonic()
            if now >= deadline:
                alive = [describe(pid) for pid in others[:5]]
                return {"clean": False,
                        "reason": f"{len(others)} process(es) still alive after {budget:.0f}s of kill requests: {alive}"}
            if asked is None or now - asked >= 2:
                say("kill", alive=len(others))
                asked = now
            time.sleep(0.005)
        held, left = lease_lines(fd)
        if not held:
            return {"clean": False, "reason": "the kernel ended the lease before the round was over "
                    f"(fs.lease-break-time {break_s:g}s): openers went through unchecked"}
        if set(left) - {1}:
            return {"clean": False, "reason": f"still opening after the kill: {left}"}
        return {"clean": True, "writer": 1 in left}

    fds, rounds = {}, dict.fromkeys(names, 0)
    try:
        for name in names:
            fds[name] = fresh(name)
    except OSError as exc:
        say("unavailable", reason=f"{type(exc).__name__}: {exc}")
        return 3
    say("ready", names=names, mode=config["mode"], lease_break_s=break_s, round_s=budget, pid=me)
    while True:
        signal.sigtimedwait([signal.SIGIO], 1.0)
        for name in names:
            fd = fds[name]
            if fcntl.fcntl(fd, F_GETLEASE) == fcntl.F_RDLCK:
                continue
            rounds[name] += 1
            round_ = rounds[name]
            held, breakers = lease_lines(fd)
            seen = [describe(pid) for pid in breakers]
            session = os.path.join(store, f"{name}.{round_}")
            os.link(os.path.join(directory, name), session)  # only the keeper can change that entry
            if os.stat(session).st_ino != os.fstat(fd).st_ino:
                raise RuntimeError(f"{session} is not the inode the keeper leased")
            fds[name] = fresh(name)
            entry = {"name": name, "round": round_, "breakers": seen}
            if not held:
                entry.update(clean=False, reason="the lease was gone before the round began")
            elif seal:
                entry.update(clear(fd))
            else:  # what the seal would kill here, were it on
                running = helpers()
                entry.update(alive=len(running), alive_sample=running[:3])
            say("round", **entry)
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
            os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
