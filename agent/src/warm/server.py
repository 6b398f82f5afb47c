# The warm interpreter's fork server (agent/src/warm/mod.rs starts it as
# `python3 -u -c <this file>`, its control socket on fd 0, stdout and
# stderr on /dev/null). It waits, fully started, for run-code requests; for
# each it forks twice, so the code runs in a fresh copy of this process that
# the agent (PID 1) adopts, waits for and kills like any process it started.
# It imports nothing beyond what a bare interpreter has loaded except
# `_socket` and `gc` (built in), so the code finds the modules a fresh
# `python3 FILE` would. A copy is only as fresh as what the interpreter read
# while starting: once any of that changed on disk (see `_inputs`), it
# answers `S` and exits, and the agent starts processes fresh. A copy ends
# as a fresh run ends, but without tearing down the interpreter (`_end`).
import os
import sys
import _socket


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _inputs():
    """What this interpreter's start read from disk, as it stands now: which
    `python3` PATH finds (a new one earlier in PATH would run instead), the
    interpreter, the site directories (their .pth files, a user site made
    since) and the import path's entries."""
    name = os.path.basename(getattr(sys, "orig_argv", ["python3"])[0])
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        found.append(_stat(candidate))
        if found[-1] is not None:
            break
    site = sys.modules.get("site")
    sites = []
    if site is not None:
        sites = site.getsitepackages() + [site.getusersitepackages()]
    return (
        found,
        _stat(sys.executable),
        [_stat(p) for p in sites],
        # Not path[0], the start's working directory: each run replaces it.
        [_stat(p) for p in sys.path[1:]],
    )


def _is_binary(path):
    """A script (`#!`: a pyenv or asdf shim) may run another interpreter per
    directory or setting: only a real executable is kept warm."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"\x7fELF"
    except OSError:
        return False


def _serve():
    control = _socket.socket(fileno=0)
    started = _inputs()
    if not _is_binary(os.path.realpath(sys.executable)):
        control.send(b"Nnot an executable binary")
        os._exit(0)
    # Out of the collector's sight: a fork's collections then neither scan
    # nor write (copy) the interpreter's own objects.
    import gc

    gc.freeze()
    # One buffer, zeroed after each fork: no request's environment (its
    # secrets) lingers in the memory later forks start from.
    buffer = bytearray(1 << 18)  # exchange.rs MAX_MESSAGE
    control.send(b"R")
    while True:
        size, ancillary, flags, _addr = control.recvmsg_into(
            [buffer], _socket.CMSG_SPACE(4 * 4)
        )
        if not size and not ancillary:
            os._exit(0)
        fds = []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [
                    int.from_bytes(data[i : i + 4], sys.byteorder)
                    for i in range(0, len(data) - len(data) % 4, 4)
                ]
        answer = b"D"
        if len(fds) != 4 or flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
            answer = b"Fbad request"
        elif _inputs() != started:
            answer = b"S"
        else:
            try:
                middle = os.fork()
            except OSError as error:
                answer = b"F%d" % error.errno
            else:
                if middle == 0:
                    try:
                        grandchild = os.fork()
                    except OSError as error:
                        os._exit(error.errno or 1)
                    if grandchild == 0:
                        control.detach()
                        return bytes(buffer[:size]), fds
                    os._exit(0)
                # The grandchild is the agent's child once the middle is reaped.
                status = os.waitpid(middle, 0)[1]
                if status != 0:
                    answer = b"F%d" % os.waitstatus_to_exitcode(status)
        buffer[:size] = bytes(size)
        for fd in fds:
            os.close(fd)
        control.send(answer)
        if answer == b"S":
            os._exit(0)


def _become(message, fds):
    """Turns the forked copy into the requested process; returns its code file."""
    stdin, stdout, stderr, report = fds
    path, cwd, *env = message.split(b"\0")
    os.write(report, b"P%d" % os.getpid())
    if os.read(report, 1) != b"G":
        os._exit(127)
    step = b"session"
    try:
        os.setsid()
        step = b"cwd"
        os.chdir(cwd)
    except OSError as error:
        os.write(report, b"E%s:%d" % (step, error.errno))
        os._exit(127)
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
        os.close(fd)
    os.write(report, b"K")
    os.close(report)
    os.environ.clear()
    for entry in env:
        key, _, value = entry.partition(b"=")
        os.environb[key] = value
    # Directories are listed afresh: packages installed since the start,
    # and import path entries made since, are found.
    sys.path_importer_cache.clear()
    return os.fsdecode(path)


def _run(path):
    """Runs `path` as `python3 FILE` would: a fresh __main__, argv, path[0]."""
    main = type(sys)("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = sys.modules["builtins"]
    main.__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader(
        "__main__", path
    )
    sys.modules["__main__"] = main
    sys.argv[:] = [path]
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as file:
        source = file.read()
    exec(compile(source, path, "exec"), main.__dict__)


def _exit_status(code):
    """A SystemExit's code as the status CPython exits with; None where
    CPython prints the code instead (not an int) or cannot take it."""
    if code is None:
        return 0
    if isinstance(code, int):
        # The int's own value, as C reads it, whatever an __int__ says.
        value = int.__index__(code)
        if -(1 << 31) <= value < (1 << 31):
            return value
    return None


def _flushed():
    """Whether stdout and stderr flushed, as Py_FinalizeEx flushes them."""
    for stream in (getattr(sys, "stdout", None), getattr(sys, "stderr", None)):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:
            return False
    return True


def _namespace(module):
    """A module's own attributes, read without running a lazy module's load."""
    try:
        return object.__getattribute__(module, "__dict__")
    except Exception:
        return {}


def _c_exit_work_possible():
    """Whether a loaded module (the interpreter's own included) has C code
    that may have exit work of its own, such as C atexit handlers or C
    streams left open, which only the C library's exit does. The standard
    library's extension modules, less ctypes, have none."""
    import _imp

    suffixes = tuple(_imp.extension_suffixes())
    for name, module in list(sys.modules.items()):
        names = _namespace(module)
        origin = getattr(names.get("__spec__"), "origin", None) or names.get("__file__")
        if isinstance(origin, str) and origin.endswith(suffixes):
            if name == "_ctypes" or os.path.dirname(origin) not in _DYNLOAD:
                return True
    return False


def _finalize(own):
    """What Py_FinalizeEx does to modules, for what the run made: a
    collection while all still live; sys's special names reset (the
    standard streams back to the originals); builtins back to the
    interpreter's start; the run's entries out of sys.modules and a
    collection; then the names of those modules still alive set to None,
    the last imported first; a last collection. Same steps, same order, so
    that `__del__` and unclosed files end as in a fresh run's exit."""
    import _weakref
    import builtins
    import gc

    if gc.isenabled():
        gc.collect()
    for name in _SYS_DELETED:
        if hasattr(sys, name):
            setattr(sys, name, None)
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, name, getattr(sys, "__%s__" % name, None))
    builtins.__dict__.clear()
    builtins.__dict__.update(_BUILTINS)
    made = [name for name, entry in sys.modules.items() if own.get(name) is not entry]
    alive = []
    for name in made:
        try:
            alive.append(_weakref.ref(sys.modules[name]))
        except TypeError:
            pass
        del sys.modules[name]
    del made
    gc.collect()
    for ref in reversed(alive):
        names = _namespace(ref())
        keys = [k for k in names if isinstance(k, str)]
        for key in [k for k in keys if k[:1] == "_" and k[1:2] != "_"]:
            names[key] = None
        for key in [k for k in keys if k != "__builtins__"]:
            names[key] = None
        del names, keys
    gc.collect()


def _end():
    """Registered before the run, so that atexit calls it last, once
    CPython's own exit work is done (non-daemon threads joined, the run's
    atexit callbacks run, each reported as a fresh run reports it). It
    finalizes what the run made, flushes stdout and stderr, and leaves by
    os._exit (or SIGINT, as CPython after an uncaught KeyboardInterrupt)
    instead of tearing down the interpreter's own state, which writes to,
    and so copies, nearly every page this copy shares with the server:
    half of a short run's cost. What the run left in the modules loaded
    before it (os, io, codecs...) and in C state is therefore not
    finalized, which Python does not promise anyway. Where the status is
    CPython's to say, a daemon thread still runs, C code may have exit
    work, or a flush fails, it returns, and CPython's normal exit does the
    rest (and exits 120 on a failed flush)."""
    import _thread

    if _status is None or not _flushed():
        return
    threads = _thread._count()
    if _interrupted:
        if not threads:
            _finalize(_own)
            _flushed()
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
        return
    if threads or _c_exit_work_possible():
        return
    _finalize(_own)
    if _flushed():
        _exit(_status)


# Taken before any run can replace or add to them.
_exit = os._exit
_signal = sys.modules["_signal"]
_BUILTINS = dict(sys.modules["builtins"].__dict__)
_DYNLOAD = frozenset(p for p in sys.path if os.path.basename(p) == "lib-dynload")
# The sys names Py_FinalizeEx sets to None before it clears modules.
_SYS_DELETED = (
    "path", "argv", "ps1", "ps2", "last_type", "last_value", "last_traceback",
    "last_exc", "path_hooks", "path_importer_cache", "meta_path",
    "__interactivehook__",
)
_path = _become(*_serve())
# What the copy holds before the run: the interpreter's own modules.
_own = dict(sys.modules)
_status, _interrupted = None, False
import atexit

atexit.register(_end)
try:
    _run(_path)
    _status = 0
except SystemExit as stop:
    _status = _exit_status(stop.code)
    raise
except BaseException as error:
    # The traceback starts at the code's own file, as a fresh run's does.
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename != _path:
        trace = trace.tb_next
    error.__traceback__ = trace
    sys.excepthook(type(error), error, trace)
    # CPython then does its exit work and, after a KeyboardInterrupt, dies
    # by SIGINT (see _end).
    _status, _interrupted = 1, isinstance(error, KeyboardInterrupt)
    del error, trace
    raise SystemExit(1)
