"""The sandbox launcher: run by rewards/sandbox.py as `python -I _sandbox_child.py`.

Reads a JSON job from stdin, then (stdlib only, single-threaded):

  1. stdin becomes /dev/null;
  2. (mode "namespaces") new network, mount, PID, IPC and UTS namespaces (as root; otherwise inside
     a new user namespace, if the kernel allows unprivileged ones);
  3. (mode "namespaces") every mount is remounted read-only in the new mount namespace; a small
     private tmpfs is mounted on /tmp and is the (fresh, empty) working directory;
  4. (mode "namespaces") fork: the child is PID 1 of the new PID namespace, mounts its own /proc
     and forks the worker; when PID 1 exits the kernel kills everything left in the namespace.
     Under mode "bwrap", bubblewrap has done 2-4 before this starts (its reaper is PID 1); the
     launcher only hands the private /tmp to the job's uid. Mode "none" skips 2-4;
  5. the worker sets rlimits (CPU, address space, file size, processes, open files, no core),
     PR_SET_NO_NEW_PRIVS, drops to the job's unprivileged uid/gid (when root), clears the
     environment, closes inherited descriptors, runs the solution, then each test case, and
     writes {"passed", "total", "error"} as JSON to the result descriptor.

Protections that could not be applied are listed in the result's "protections" (absent ones).
"""

import ctypes
import json
import os
import resource
import sys
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def mount(source, target, fstype, flags, data=None) -> bool:
    def enc(s):
        return s.encode() if isinstance(s, str) else s

    return libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0


def mountpoints() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            points.append(point)
    return points


def isolate(job: dict, have: list) -> str | None:
    """Namespaces and the read-only filesystem; returns the working directory (None = job's)."""
    root = os.geteuid() == 0
    mnt_before = os.readlink("/proc/self/ns/mnt")
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if root:
        ok = libc.unshare(flags) == 0
    else:
        uid, gid = os.getuid(), os.getgid()
        ok = libc.unshare(flags | CLONE_NEWUSER) == 0
        if ok:
            try:
                with open("/proc/self/setgroups", "w") as fh:
                    fh.write("deny")
                with open("/proc/self/uid_map", "w") as fh:
                    fh.write(f"0 {uid} 1")
                with open("/proc/self/gid_map", "w") as fh:
                    fh.write(f"0 {gid} 1")
            except OSError:
                pass
        elif libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            have.append("network")
            return None
    if not ok:
        return None
    have += ["network", "pid", "ipc"]
    # never touch mounts unless we really are in a new mount namespace
    if os.readlink("/proc/self/ns/mnt") == mnt_before or not mount(None, "/", None, MS_REC | MS_PRIVATE):
        return None
    failed = 0
    for point in sorted(set(mountpoints()), key=len):
        if not mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY):
            failed += 1
    owner = job["uid"] if root else 0
    size = f"size={job['tmpfs_mb']}m,nr_inodes=4096,mode=0700,uid={owner},gid={owner}"
    if not mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size):
        return None
    if failed == 0:
        have.append("readonly_fs")
    have.append("private_tmp")
    return "/tmp"


def limit(job: dict, have: list) -> None:
    mib = 1024 * 1024
    cpu = int(job["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize_mb"] * mib, job["fsize_mb"] * mib))
    resource.setrlimit(resource.RLIMIT_NOFILE, (job["nofile"], job["nofile"]))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] * mib, job["memory_mb"] * mib))
    resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
    have.append("rlimits")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        have.append("no_new_privs")


def drop_privileges(job: dict, have: list) -> None:
    if not job["host_root"]:  # unprivileged (maybe root inside its own user namespace): nothing to drop
        return
    uid = job["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() == 0 or os.getuid() == 0:
        raise RuntimeError("could not drop root")
    have.append("unprivileged_uid")


# Imported while still privileged: the interpreter's own files may be unreadable to the sandbox
# uid (e.g. a pyenv Python under /root), so solutions get the common standard library pre-loaded.
PRELOAD = (
    "array",
    "bisect",
    "cmath",
    "collections",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "encodings.idna",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "math",
    "operator",
    "random",
    "re",
    "socket",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "typing",
    "unicodedata",
)


def work(job: dict, result_fd: int, have: list) -> None:
    """The worker: limits, privileges, environment, then the solution and its tests."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    limit(job, have)
    drop_privileges(job, have)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": os.getcwd(), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"})
    os.closerange(3, result_fd)
    os.closerange(result_fd + 1, 65536)
    report = {"passed": 0, "total": len(job["tests"]), "error": None, "protections": have}
    os.write(result_fd, b"R")  # ready: the wall clock starts now
    scope = {"__name__": "__main__"}
    try:
        exec(compile(job["code"], "solution.py", "exec"), scope)
    except BaseException as err:  # noqa: BLE001 - SystemExit, MemoryError, ... all end the job
        report["error"] = f"{type(err).__name__}: {err}"[:500]
        report["traceback"] = traceback.format_exc()[-2000:]
    if report["error"] is None:
        for test in job["tests"]:
            try:
                exec(compile(test, "test", "exec"), scope)
                report["passed"] += 1
            except BaseException:  # noqa: BLE001
                pass
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        pass
    os.write(result_fd, b"\n" + json.dumps(report).encode())
    os._exit(0)


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    result_fd = job["result_fd"]
    have: list = []
    job["host_root"] = os.geteuid() == 0 and job["mode"] != "none"
    workdir = None
    if job["mode"] == "bwrap":  # bubblewrap made the namespaces and mounts; /tmp is its private tmpfs
        have += job["bwrap_protections"]
        workdir = "/tmp"
        if job["host_root"]:
            os.chown(workdir, job["uid"], job["uid"])
    elif job["mode"] == "namespaces":
        try:
            workdir = isolate(job, have)
        except OSError:
            workdir = None
    os.chdir(workdir or job["workdir"])
    if job["mode"] == "namespaces":
        init = os.fork()
        if init:  # the launcher: wait for PID 1 of the namespace, pass on its status
            os.close(result_fd)
            _, status = os.waitpid(init, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        if "pid" in have:
            if mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC):
                have.append("private_proc")
            worker = os.fork()
            if worker:  # PID 1: reap until the worker ends; leaving tears the namespace down
                os.close(result_fd)
                while True:
                    pid, status = os.wait()
                    if pid == worker:
                        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        work(job, result_fd, have)
    except BaseException as err:  # noqa: BLE001 - setup failed: report, never run the code unconfined
        os.write(
            result_fd,
            b"\n"
            + json.dumps(
                {
                    "passed": 0,
                    "total": len(job["tests"]),
                    "protections": have,
                    "error": f"sandbox setup failed: {type(err).__name__}: {err}",
                }
            ).encode(),
        )
        os._exit(70)


if __name__ == "__main__":
    main()
