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


def read(path, limit=4096):
    with open(path, "rb") as handle:
        return handle.read(limit)


def describe(pid):
    try:
        stat = read(f"/proc/{pid}/stat").decode("utf-8", "replace")
        command = read(f"/proc/{pid}/cmdline", 300).replace(b"\0", b" ").decode("utf-8", "replace")
        return {"pid": pid, "ppid": int(stat.rsplit(")", 1)[1].split()[1]), "cmd": command.strip()}
    except (OSError, IndexError, ValueError):
        return {"pid": pid, "gone": True}


def lease_break_s():
    """How long the kernel lets a lease holder answer a break before it ends the lease itself."""
    try:
        return float(read("/proc/sys/fs/lease-break-time").strip() or 45)
    except (OSError, ValueError):
        return 45.0


class Keeper:
    def __init__(self, config):
        self.directory, self.store, self.names = config["directory"], config["store"], config["names"]
        self.mode = config["mode"]
        self.seal = self.mode == "seal"
        self.marker = config["marker"]
        self.me, self.uid = os.getpid(), os.getuid()
        os.umask(0)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})  # a lease break is taken with sigtimedwait
        self.manifest = os.fdopen(os.open(os.path.join(self.store, config["manifest"]),
                                          os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600), "a")
        self.break_s = lease_break_s()
        self.budget = min(float(config["round_s"]), self.break_s / 2)
        self.fds, self.rounds = {}, dict.fromkeys(self.names, 0)

    def say(self, event, **fields):
        fields["event"] = event
        line = json.dumps(fields, sort_keys=True)
        self.manifest.write(line + "\n")
        self.manifest.flush()
        sys.stdout.write(self.marker + line + "\n")
        sys.stdout.flush()

    def lease_lines(self, fd):
        """Our lease on fd's inode in /proc/locks, and the pids blocked opening it (the breakers)."""
        info = os.fstat(fd)
        key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
        ours, breakers = set(), []
        with open("/proc/locks") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "->" and parts[0] in ours and parts[2] == "LEASE":
                    breakers.append(int(parts[5]))
                elif len(parts) >= 6 and parts[1] == "LEASE" and parts[5] == key and parts[4] == str(self.me):
                    ours.add(parts[0])
        return bool(ours), breakers

    def alive_others(self):
        """Every process of the namespace but test.sh (pid 1) and the keeper's own with a thread not yet dead."""
        alive = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or entry == "1":
                continue
            try:
                status = read(f"/proc/{entry}/status").decode("utf-8", "replace")
                uid = int(status.split("\nUid:", 1)[1].split()[0])
                if uid == self.uid:
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

    def helpers(self):
        """What test.sh itself keeps running (a process whose parent is outside the namespace came through the
        engine's exec: Lego's own)."""
        return [info for info in map(describe, self.alive_others()) if info.get("ppid", 0) != 0]

    def fresh(self, name):
        """A new empty inode, dated 1970 (a write redates it), leased, then put at the path in one rename."""
        spare = os.path.join(self.store, "." + name + ".new")
        fd = os.open(spare, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC, 0o622)
        os.utime(spare, (0, 0))
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
        os.rename(spare, os.path.join(self.directory, name))
        return fd

    def clear(self, fd):
        """Until only test.sh is left: ask Lego to kill the rest, and check /proc."""
        asked = None
        deadline = time.monotonic() + self.budget
        while True:
            others = self.alive_others()
            if not others:
                break
            now = time.monotonic()
            if now >= deadline:
                alive = [describe(pid) for pid in others[:5]]
                return {"clean": False, "reason": f"{len(others)} process(es) still alive after "
                                                  f"{self.budget:.0f}s of kill requests: {alive}"}
            if asked is None or now - asked >= 2:
                self.say("kill", alive=len(others))
                asked = now
            time.sleep(0.005)
        held, left = self.lease_lines(fd)
        if not held:
            return {"clean": False, "reason": "the kernel ended the lease before the round was over "
                    f"(fs.lease-break-time {self.break_s:g}s): openers went through unchecked"}
        if set(left) - {1}:
            return {"clean": False, "reason": f"still opening after the kill: {left}"}
        return {"clean": True, "writer": 1 in left}

    def take_round(self, name):
        """An open of `name` for writing is blocked on its lease: keep the inode being opened as this round's
        session file, put a fresh leased one at the path, clear (seal) or survey (watch), record, release."""
        fd = self.fds[name]
        self.rounds[name] += 1
        round_ = self.rounds[name]
        held, breakers = self.lease_lines(fd)
        seen = [describe(pid) for pid in breakers]
        session = os.path.join(self.store, f"{name}.{round_}")
        os.link(os.path.join(self.directory, name), session)  # only the keeper can change that entry
        if os.stat(session).st_ino != os.fstat(fd).st_ino:
            raise RuntimeError(f"{session} is not the inode the keeper leased")
        self.fds[name] = self.fresh(name)
        entry = {"name": name, "round": round_, "breakers": seen}
        if not held:
            entry.update(clean=False, reason="the lease was gone before the round began")
        elif self.seal:
            entry.update(self.clear(fd))
        else:  # what the seal would kill here, were it on
            running = self.helpers()
            entry.update(alive=len(running), alive_sample=running[:3])
        self.say("round", **entry)
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)

    def run(self):
        try:
            for name in self.names:
                self.fds[name] = self.fresh(name)
        except OSError as exc:
            self.say("unavailable", reason=f"{type(exc).__name__}: {exc}")
            return 3
        self.say("ready", names=self.names, mode=self.mode, lease_break_s=self.break_s, round_s=self.budget,
                 pid=self.me)
        while True:
            signal.sigtimedwait([signal.SIGIO], 1.0)
            for name in self.names:
                if fcntl.fcntl(self.fds[name], F_GETLEASE) != fcntl.F_RDLCK:
                    self.take_round(name)


def main():
    return Keeper(json.loads(sys.argv[1])).run()


if __name__ == "__main__":
    sys.exit(main())
