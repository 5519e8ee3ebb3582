"""The program's objects used from the tests' process, and the tests' objects from the program's: the two sides
of a graded sandbox run (sandbox_guard.py, "graded" mode; the wire itself is sandbox_wire.py).

The guard forks two processes before either has seen anything secret: the PROGRAM side runs the code under test,
the GRADER side runs the tests. They share nothing but two pipes. The expected values live only in the grader; the program only ever receives what a test passes it
(the arguments of the calls into the program: its inputs). Whatever comes back arrives as plain data built here by
the decoder, never by the program's code (ints, floats, strings, lists, tuples, dicts, sets, bytes, Decimal,
Fraction, dates, numpy arrays of numbers), or as a handle, `Remote`, that forwards attribute reads and writes,
calls, iteration, indexing, len, bool, str and repr. So a program cannot read the expected values, and cannot hand
the grader an object whose `__eq__` always holds.

Comparisons are never forwarded when one side is a grader value: `Remote == 3` is False (a handle equals only
itself), `Remote - expected` is a TypeError; forwarding them would give the expected value to the program and let
its own operator decide. Comparisons and arithmetic between two handles are forwarded: both objects are the
program's own, so its own `__eq__` decides (e.g. `Interval.parse("9:00-10:00") == Interval(540, 600)`); a test that
compares two objects of the program trusts the program's comparison by design. `x in Remote` iterates the program's
container and compares in the grader.

Exceptions the program raises reach the tests as exceptions: builtin types as themselves (with the program's
arguments when they are plain data), the program's own exception classes as stand-in classes of the grader with
the same names and hierarchy (`except InsufficientFunds:` works; `str(exc)` is the program's text).

Callables and iterators of the grader passed into the program (a key function, a generator) become handles on the
program side that support calls and iteration only, never attribute reads: the program cannot walk from a test's
lambda to the test's globals.

Standalone (stdlib only): loaded by the guard by path, after sandbox_wire.py.
"""

import io
import sys
import types

try:
    from . import sandbox_wire as wire
except ImportError:  # loaded by path in the sandbox (sandbox_guard.load_sibling), after the wire
    import _mixrl_sandbox_wire as wire

MAX_OUTPUT_CHARS, ProgramExit, ProgramGone, ProtocolError, RefusedOperation = (
    wire.MAX_OUTPUT_CHARS, wire.ProgramExit, wire.ProgramGone, wire.ProtocolError, wire.RefusedOperation)
_int, _list, _str, channel = wire._int, wire._list, wire._str, wire.channel


# ---------------------------------------------------------------------------------------------- grader side
def _call_fields(conn, args, kwargs):
    return {"args": [conn.encode(a) for a in args], "kwargs": {str(k): conn.encode(v) for k, v in kwargs.items()}}


class Handle:
    """A handle to an object of the other side, forwarding what both sides allow: calls, attribute reads and
    writes, iteration, len, bool, indexing, str and repr (the owner's handler refuses what it does not allow)."""

    __slots__ = ("_conn", "_id", "__weakref__")

    def __init__(self, conn, hid):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_id", hid)

    def _ask(self, op, **fields):
        return object.__getattribute__(self, "_conn").request(op, obj=object.__getattribute__(self, "_id"), **fields)

    def __getattr__(self, name):
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        conn = object.__getattribute__(self, "_conn")
        self._ask("setattr", name=str(name), value=conn.encode(value))

    def __call__(self, *args, **kwargs):
        conn = object.__getattribute__(self, "_conn")
        return conn.request("call", writeback_to=(args, kwargs), obj=object.__getattribute__(self, "_id"),
                            **_call_fields(conn, args, kwargs))

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return _int_result(self._ask("len"), "len")

    def __bool__(self):
        value = self._ask("bool")
        if type(value) is not bool:
            raise TypeError("__bool__ did not return a bool")
        return value

    def __getitem__(self, key):
        conn = object.__getattribute__(self, "_conn")
        return self._ask("getitem", key=conn.encode(key))

    def __str__(self):
        return _str_result(self._ask("str"))

    def __repr__(self):
        return _str_result(self._ask("repr"))


class Remote(Handle):
    """(grader) A handle to an object of the program (see the module docstring for what it forwards)."""

    __slots__ = ()

    def __delattr__(self, name):
        self._ask("delattr", name=str(name))

    def __index__(self):
        return _int_result(self._ask("index"), "__index__")

    def __int__(self):
        return _int_result(self._ask("int"), "__int__")

    def __float__(self):
        value = self._ask("float")
        if type(value) is not float:
            raise TypeError("the program's __float__ did not return a float")
        return value

    def __setitem__(self, key, value):
        conn = object.__getattribute__(self, "_conn")
        self._ask("setitem", key=conn.encode(key), value=conn.encode(value))

    def __delitem__(self, key):
        conn = object.__getattribute__(self, "_conn")
        self._ask("delitem", key=conn.encode(key))

    def __format__(self, spec):
        return _str_result(self._ask("format", spec=str(spec)))

    def __hash__(self):
        return object.__hash__(self)

    def _binary(self, op, other):
        if not isinstance(other, Remote):
            return NotImplemented  # never hand a grader value to the program's operator
        if object.__getattribute__(other, "_conn") is not object.__getattribute__(self, "_conn"):
            return NotImplemented
        return self._ask("binary", name=op, other=object.__getattribute__(other, "_id"))

    def __eq__(self, other):
        if other is self:
            return True
        result = self._binary("__eq__", other)
        return False if result is NotImplemented else result

    def __ne__(self, other):
        if other is self:
            return False
        result = self._binary("__ne__", other)
        return True if result is NotImplemented else result

    def __instancecheck__(self, obj):
        if not isinstance(obj, Remote):
            return False
        conn = object.__getattribute__(self, "_conn")
        return bool(conn.request("isinstance", obj=object.__getattribute__(obj, "_id"),
                                 cls=object.__getattribute__(self, "_id")) is True)

    def __subclasscheck__(self, cls):
        if not isinstance(cls, Remote):
            return False
        conn = object.__getattribute__(self, "_conn")
        return bool(conn.request("issubclass", obj=object.__getattribute__(cls, "_id"),
                                 cls=object.__getattribute__(self, "_id")) is True)


def _remote_binary(name):
    def method(self, other):
        return self._binary(name, other)
    method.__name__ = name
    return method


# No __contains__: `x in Remote` falls back to iterating the program's container and comparing here.
for _op in ("__lt__", "__le__", "__gt__", "__ge__", "__add__", "__sub__", "__mul__", "__truediv__",
            "__floordiv__", "__mod__", "__and__", "__or__", "__xor__"):
    setattr(Remote, _op, _remote_binary(_op))


def _int_result(value, what):
    if type(value) is not int:
        raise TypeError(f"the program's {what} did not return an int")
    return value


def _str_result(value):
    if type(value) is not str:
        raise TypeError("the program's __str__/__repr__ did not return a str")
    return value


class RemoteModule(types.ModuleType):
    """(grader) A module of the program: names it does not hold locally are read from the program."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        conn, hid = self.__dict__["_remote_conn"], self.__dict__["_remote_id"]
        return conn.request("getattr", obj=hid, name=name)


def remote_module(conn, hid, name, package):
    module = RemoteModule(name)
    module.__dict__["_remote_conn"], module.__dict__["_remote_id"] = conn, hid
    if package:
        module.__path__ = []
    return module


class RemoteFinder:
    """(grader) `import pkg` / `from pkg.sub import x` for the program's own top-level packages: the module is
    imported in the program's process and used through a handle; every other import stays local."""

    def __init__(self, conn, packages):
        self.conn, self.packages = conn, frozenset(packages)

    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] not in self.packages:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = self.conn.request("import", name=spec.name)
        if not isinstance(module, RemoteModule):
            raise ImportError(f"{spec.name} is not a module of the program")
        return module

    def exec_module(self, module):
        return None


# ---------------------------------------------------------------------------------------------- program side
class GraderObject(Handle):
    """(program) An object of the tests passed into a call: calls, iteration, len/bool/indexing/str, and the data
    attributes and methods of the tests' own class instances (a TreeNode built by the tests); nothing else (the
    grader's `grader_handler` decides)."""

    __slots__ = ()


class Capture(io.TextIOBase):
    """What the program prints during one call: the first MAX_OUTPUT_CHARS kept."""

    def __init__(self):
        self.parts, self.size = [], 0

    def write(self, s):
        s = str(s)
        if self.size < MAX_OUTPUT_CHARS:
            self.parts.append(s[:MAX_OUTPUT_CHARS - self.size])
        self.size += len(s)
        return len(s)

    def writable(self):
        return True

    def text(self):
        return "".join(self.parts)


def _call_args(conn, msg):
    raw_kwargs = msg.get("kwargs")
    if type(raw_kwargs) is not dict:
        raise ProtocolError("call without keyword arguments")
    return [conn.decode(a) for a in _list(msg.get("args"))], {str(k): conn.decode(v) for k, v in raw_kwargs.items()}


def program_handler(conn, msg):
    """(program) Serve one request of the tests."""
    op = msg.get("op")
    if op == "import":
        import importlib

        return {"v": conn.encode(importlib.import_module(_str(msg.get("name"))))}
    obj = conn.own(msg.get("obj"))
    if op == "call":
        args, kwargs = _call_args(conn, msg)
        out, saved = Capture(), (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = out
        try:
            value = obj(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - goes back as the call's error, with its output
            sys.stdout, sys.stderr = saved
            return {"err": conn.encode_error(exc), "out": out.text(),
                    **_writeback(conn, msg, args, kwargs)}
        sys.stdout, sys.stderr = saved
        return {"v": conn.encode(value), "out": out.text(), **_writeback(conn, msg, args, kwargs)}
    if op == "getattr":
        return {"v": conn.encode(getattr(obj, _str(msg.get("name"))))}
    if op == "setattr":
        setattr(obj, _str(msg.get("name")), conn.decode(msg.get("value")))
        return {"v": None}
    if op == "delattr":
        delattr(obj, _str(msg.get("name")))
        return {"v": None}
    if op == "iter":
        return {"v": conn.encode(iter(obj))}
    if op == "next":
        return {"v": conn.encode(next(obj))}
    if op == "getitem":
        return {"v": conn.encode(obj[conn.decode(msg.get("key"))])}
    if op == "setitem":
        obj[conn.decode(msg.get("key"))] = conn.decode(msg.get("value"))
        return {"v": None}
    if op == "delitem":
        del obj[conn.decode(msg.get("key"))]
        return {"v": None}
    simple = {"len": len, "bool": bool, "str": str, "repr": repr, "index": lambda o: o.__index__(),
              "int": int, "float": float}
    if op in simple:
        return {"v": conn.encode(simple[op](obj))}
    if op == "format":
        return {"v": conn.encode(format(obj, _str(msg.get("spec"))))}
    if op == "binary":
        name = _str(msg.get("name"))
        if not (name.startswith("__") and name.endswith("__")):
            raise ProtocolError("not an operator")
        import operator

        func = getattr(operator, name)
        return {"v": conn.encode(func(obj, conn.own(msg.get("other"))))}
    if op in ("isinstance", "issubclass"):
        cls = conn.own(msg.get("cls"))
        return {"v": bool((isinstance if op == "isinstance" else issubclass)(obj, cls))}
    raise ProtocolError(f"unknown operation {str(op)[:40]!r}")


def _writeback(conn, msg, args, kwargs):
    """Plain containers of the tests the call changed in place, re-encoded (see `_call`)."""
    changed = {}
    for key, raw, value in [(str(i), a, args[i]) for i, a in enumerate(msg["args"])] + \
            [("=" + k, msg["kwargs"][k], kwargs[k]) for k in kwargs]:
        if type(value) in (list, dict, set, bytearray):
            try:
                now = conn.encode(value)
            except BaseException:  # noqa: BLE001 - the call left it in a state that cannot travel
                continue
            if now != raw:
                changed[key] = now
    return {"writeback": changed} if changed else {}


def grader_handler(conn, msg):
    """(grader) What the program may do with the tests' objects passed to it: call and iterate them, ask their
    len/bool/str/repr/items, and read or set the DATA attributes (or call the methods) of instances of classes the
    tests define. No other attribute is reachable: a generator's gi_frame or a function's globals would lead to
    the tests' expected values."""
    op = msg.get("op")
    obj = conn.own(msg.get("obj"))
    if op == "call":
        args, kwargs = _call_args(conn, msg)
        return {"v": conn.encode(obj(*args, **kwargs))}
    if op in ("iter", "next", "len", "bool", "str", "repr"):
        func = {"iter": iter, "next": next, "len": len, "bool": bool, "str": str, "repr": repr}[op]
        return {"v": conn.encode(func(obj))}
    if op == "getitem":
        return {"v": conn.encode(obj[conn.decode(msg.get("key"))])}
    if op in ("getattr", "setattr"):
        name = _str(msg.get("name"))
        cls = type(obj)
        own = isinstance(getattr(obj, "__dict__", None), dict) and getattr(cls, "__module__", None) in conn.test_modules
        if not own or name.startswith("_"):
            raise AttributeError(f"the tests' {cls.__name__} object exposes no attribute {name!r} to the program")
        if op == "setattr":
            obj.__dict__[name] = conn.decode(msg.get("value"))
            return {"v": None}
        if name in obj.__dict__:
            return {"v": conn.encode(obj.__dict__[name])}
        member = cls.__dict__.get(name)
        if isinstance(member, types.FunctionType):
            return {"v": conn.encode(types.MethodType(member, obj))}
        raise AttributeError(f"the tests' {cls.__name__} object has no data attribute {name!r}")
    raise RefusedOperation(f"the tests' objects do not support {str(op)[:40]!r}")


def program_globals(conn, ns):
    """(program) The program's top-level names for the tests: what the standard library defines travels by name
    (the grader uses its own copy), everything else encoded (functions and classes as handles)."""
    out = {}
    for name, value in list(ns.items()):
        if type(name) is not str or name.startswith("__"):
            continue
        try:
            out[name] = _stdlib_name(value) or conn.encode(value)
        except BaseException:  # noqa: BLE001 - a name that cannot travel is left out
            continue
    return out


def _stdlib_name(value):
    if isinstance(value, types.ModuleType):
        return None  # a module handle: the grader imports its own copy by the module's name
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or module.split(".")[0] not in sys.stdlib_module_names:
        return None
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return {"t": "stdlib", "module": module, "name": qualname} if obj is value else None


def connect(rfd, wfd, side):
    """This side's end of the wire: its handler of the other side's requests and its objects for their handles."""
    if side == "grader":
        return wire.Connection(rfd, wfd, side, grader_handler, _grader_wrap)
    return wire.Connection(rfd, wfd, side, program_handler, lambda conn, hid, kind: GraderObject(conn, hid))


def _grader_wrap(conn, hid, kind):
    if type(kind) is dict and "module" in kind:
        return remote_module(conn, hid, _str(kind["module"])[:200], bool(kind.get("package")))
    return Remote(conn, hid)
