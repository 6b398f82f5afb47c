# The warm interpreter's fork server (agent/src/warm/mod.rs starts it as
# `python3 -u -c <this file>`, its control socket on fd 0, stdout and
# stderr on /dev/null). It waits, fully started, for run-code requests; for
# each it forks twice, so the code runs in a fresh copy of this process that
# the agent (PID 1) adopts, waits for and kills like any process it started.
# It imports nothing beyond what a bare interpreter has loaded except
# `_socket` and `gc` (built in), so the code finds the modules a fresh
# `python3 FILE` would. A copy is only as fresh as what the interpreter read
# while starting: once any of that changed on disk (see `_inputs`), it
# answers `S` and exits, and the agent starts processes fresh.
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
    if isinstance(code, int) and -(1 << 31) <= code < (1 << 31):
        return int(code)
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


def _run_modules(own):
    """The modules the run loaded, its __main__ among them, in sys.modules'
    order; None when any module loaded, the interpreter's own included, has
    C code that may have exit work of its own (C atexit, buffered C stdio)
    needing the C library's exit. Only the standard library's extension
    modules, less ctypes, are known to have none."""
    import _imp

    suffixes = tuple(_imp.extension_suffixes())
    made = []
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
        if isinstance(origin, str) and origin.endswith(suffixes):
            if name == "_ctypes" or os.path.dirname(origin) not in _DYNLOAD:
                return None
        if own.get(name) is not module and isinstance(module, type(sys)):
            made.append((name, module))
    return made


def _clear(made):
    """Finalizes what the run made: out of sys.modules, then each module's
    names set to None as Py_FinalizeEx clears a module it finds alive, the
    last imported first, then a collection for what is left in cycles.
    Cleared rather than left to the collector, so that an unclosed file is
    flushed before its descriptor is closed, as in a fresh run's exit."""
    import gc

    for name in ("last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    module = names = keys = None
    for name, module in made:
        if sys.modules.get(name) is module:
            del sys.modules[name]
    for _, module in reversed(made):
        names = module.__dict__
        keys = [k for k in names if isinstance(k, str)]
        for key in [k for k in keys if k[:1] == "_" and k[1:2] != "_"]:
            names[key] = None
        for key in [k for k in keys if k != "__builtins__"]:
            names[key] = None
    made.clear()
    del module, names, keys
    gc.collect()


def _leave(status, own):
    """Ends the run as a fresh one ends: non-daemon threads joined, atexit
    callbacks run, stdout and stderr flushed, what the run made finalized.
    It then leaves with os._exit instead of tearing down the interpreter's
    own state, which writes to (and so copies) nearly every page this copy
    shares with the server: half of a short run's cost. Objects the run
    left in the interpreter's own modules (sys, builtins) are therefore not
    finalized, which Python does not promise anyway. Where C code may have
    exit work, or stdout or stderr cannot be flushed, it takes the normal
    way out, which does what is left (and exits 120 on a failed flush)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException as error:
            # As Py_FinalizeEx reports it (a ^C while waiting), and goes on.
            try:
                sys.stderr.write("Exception ignored in: %r\n" % (threading,))
                sys.excepthook(type(error), error, error.__traceback__)
            except BaseException:
                pass
            del error
    import atexit

    atexit._run_exitfuncs()
    made = _run_modules(own)
    if made is not None and _flushed():
        _clear(made)
        if _flushed():
            _exit(status)
    raise SystemExit(status)


# Bound before any run can replace them.
_exit = os._exit
_DYNLOAD = frozenset(p for p in sys.path if os.path.basename(p) == "lib-dynload")
_path = _become(*_serve())
# What the copy holds before the run: the interpreter's own modules.
_own = dict(sys.modules)
_status = 1
try:
    _run(_path)
    _status = 0
except SystemExit as stop:
    _status = _exit_status(stop.code)
    if _status is None:
        raise
except BaseException as error:
    # The traceback starts at the code's own file, as a fresh run's does.
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename != _path:
        trace = trace.tb_next
    error.__traceback__ = trace
    sys.excepthook(type(error), error, trace)
    if isinstance(error, KeyboardInterrupt):
        # As CPython ends then: its exit work first, then death by SIGINT.
        import atexit
        import signal

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    del error, trace
_leave(_status, _own)
