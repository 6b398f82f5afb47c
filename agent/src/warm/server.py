# The warm interpreter's fork server (agent/src/warm/mod.rs starts it as
# `python3 -u -c <this file>`, its control socket on fd 0, stdout and
# stderr on /dev/null). It waits, fully started, for run-code requests; for
# each it forks twice, so the code runs in a fresh copy of this process that
# the agent (PID 1) adopts, waits for and kills like any process it started.
# It imports nothing beyond what a bare interpreter has loaded except
# built-in modules (`_socket`, `gc`, `_imp`, `_thread`, `_weakref`,
# `atexit`), so the code finds the modules a fresh
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
    if "__annotations__" in vars(sys.modules["__main__"]):
        main.__annotations__ = {}
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
        # The int's own value, as C reads it, whatever an __index__ says.
        value = int.__index__(code)
        if -(1 << 31) <= value < (1 << 31):
            return value
    return None


def _flushed():
    """Whether stdout and stderr flushed, as Py_FinalizeEx flushes them (a
    stream whose `closed` cannot be read counts as open)."""
    for stream in (getattr(sys, "stdout", None), getattr(sys, "stderr", None)):
        if stream is None:
            continue
        try:
            if stream.closed:
                continue
        except Exception:
            pass
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
    suffixes = tuple(_imp.extension_suffixes())
    for name, module in list(sys.modules.items()):
        if not isinstance(module, _Module):
            continue
        names = _namespace(module)
        try:
            origin = getattr(names.get("__spec__"), "origin", None) or names.get("__file__")
        except Exception:
            return True
        if isinstance(origin, str) and origin.endswith(suffixes):
            if name == "_ctypes" or _dirname(origin) not in _DYNLOAD:
                return True
    return False


def _finalize(own):
    """What Py_FinalizeEx does to Python state after the atexit callbacks,
    in its order, short of tearing down the interpreter's own objects:
    Python signal handlers dropped; a collection while every module still
    lives; sys's special names set to None and the standard streams put
    back; every sys.modules entry set to None, then none left; builtins
    back to the interpreter's start (less what io and site add, as
    CPython's copy is taken before them); a collection; the names of the
    run's modules still alive set to None, the last imported first; what
    the run changed in sys set to None; a last collection. So `__del__`,
    weak references and unclosed files end as in a fresh run's exit."""
    for number in _signal.valid_signals():
        try:
            if callable(_signal.getsignal(number)):
                _signal.signal(number, _signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    if _gc.isenabled():
        _gc.collect()
    for name in _SYS_DELETED:
        setattr(sys, name, None)
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, name, getattr(sys, "__%s__" % name, None))
    modules = sys.modules
    alive = []
    entry = None
    for name, entry in list(modules.items()):
        if isinstance(entry, _Module):
            if own.get(name) is not entry:
                alive.append(_weakref.ref(entry))
            modules[name] = None
    del entry
    modules.clear()
    # Replaced, then dropped: what a run left in builtins goes while the
    # real builtins are back, so its `__del__` still finds them.
    left = dict(_builtins.__dict__)
    _builtins.__dict__.clear()
    _builtins.__dict__.update(_BUILTINS)
    del left
    _gc.collect()
    for ref in reversed(alive):
        names = _namespace(ref())
        keys = [k for k in names if isinstance(k, str)]
        for key in [k for k in keys if k[:1] == "_" and k[1:2] != "_"]:
            names[key] = None
        for key in [k for k in keys if k != "__builtins__"]:
            names[key] = None
        del names, keys
    streams = ("stdout", "stderr", "__stdout__", "__stderr__")
    for key, value in list(sys.__dict__.items()):
        if _SYS.get(key, _SYS) is not value and key not in streams:
            sys.__dict__[key] = None
    del key, value
    _gc.collect()


def _end():
    """Registered before the run, so that atexit calls it last, once
    CPython's own exit work is done (non-daemon threads joined, the run's
    atexit callbacks run, each reported as a fresh run reports it). It
    finalizes what the run made (`_finalize`), flushes stdout and stderr,
    and leaves by os._exit (or SIGINT, as CPython after an uncaught
    KeyboardInterrupt) instead of tearing down the interpreter's own state,
    which writes to, and so copies, nearly every page this copy shares with
    the server: half of a short run's cost. What the run left in the
    modules loaded before it (os, io, codecs...) or in C state is therefore
    not finalized, which Python does not promise anyway. Where the status
    is CPython's to say, a daemon thread still runs, C code may have exit
    work, or the first flush fails, it returns, and CPython's normal exit
    does the rest (and exits 120 on a failed flush)."""
    if _status is None or not _flushed():
        return
    if _thread._count():
        return
    if _interrupted:
        _finalize(_own)
        _flushed()
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        _signal.raise_signal(_signal.SIGINT)
        # As CPython's exit_sigint where the signal did not end it.
        _exit(130)
    if _c_exit_work_possible():
        return
    _finalize(_own)
    # Only what __del__ wrote since: a fresh run's second flush finds
    # sys already cleared, so a failure here counts for nothing.
    _flushed()
    _exit(_status)


def _keep_last(error):
    """Keeps an uncaught exception in sys.last_*, as PyErr_Print does."""
    sys.last_type, sys.last_value = type(error), error
    sys.last_traceback = error.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = error


def _report(error):
    """Prints an uncaught exception as PyErr_Print does, its traceback
    starting at the code's own file, and keeps it in sys.last_* (whose
    frames CPython keeps alive until it finalizes)."""
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename != _path:
        trace = trace.tb_next
    error.__traceback__ = trace
    _keep_last(error)
    hook = sys.__dict__.get("excepthook")
    if hook is None:
        sys.stderr.write("sys.excepthook is missing\n")
        sys.__excepthook__(type(error), error, trace)
        return
    try:
        hook(type(error), error, trace)
    except BaseException as failure:
        # Without this frame, and not as raised while handling `error`.
        failure.__traceback__ = failure.__traceback__.tb_next
        failure.__suppress_context__ = True
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(failure), failure, failure.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(error), error, trace)


# Bound before any run can replace them. All are loaded in a bare
# interpreter already (gc by `_serve`).
import _imp
import _thread
import _weakref
import builtins as _builtins
import gc as _gc

_Module = type(sys)
_dirname = os.path.dirname
_exit = os._exit
_signal = sys.modules["_signal"]
# CPython's copy of builtins is taken before io adds `open` and site its
# helpers (exit, quit, help, copyright, credits, license).
_BUILTINS = {
    k: v
    for k, v in vars(_builtins).items()
    if k != "open" and type(v).__module__ != "_sitebuiltins"
}
_DYNLOAD = frozenset(p for p in sys.path if os.path.basename(p) == "lib-dynload")
# The sys names Py_FinalizeEx sets to None before it clears modules.
_SYS_DELETED = (
    "path", "argv", "ps1", "ps2", "last_type", "last_value", "last_traceback",
    "last_exc", "path_hooks", "path_importer_cache", "meta_path",
    "__interactivehook__",
)
_path = _become(*_serve())
# What the copy holds before the run: the interpreter's own modules and sys.
_own = dict(sys.modules)
_SYS = dict(sys.__dict__)
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
    _report(error)
    _status, _interrupted = 1, isinstance(error, KeyboardInterrupt)
    if _interrupted:
        # CPython dies by SIGINT after its exit work only when the run
        # itself ends in a KeyboardInterrupt: one is raised again, and the
        # report it makes is swallowed once, as the one above was made.
        _hook = sys.__dict__.get("excepthook")

        def _quiet(*_args, _error=error):
            if _hook is None:
                sys.__dict__.pop("excepthook", None)
            else:
                sys.excepthook = _hook
            _keep_last(_error)

        sys.excepthook = _quiet
        raise KeyboardInterrupt from None
    del error
    raise SystemExit(1) from None
