"""Named functions with typed parameters: one registry for offline transforms and augmentation ops.

Both halves of kiln name their operations in YAML lists of the same form,
an entry being a name or a one-key mapping ``{name: {param: value}}``:

    transforms:                       augment:
      - resize: {shorter_side: 256}     - random_resized_crop: {size: 224}
      - equalize                        - random_flip_left_right

A `Registry` holds the functions of one kind (`kiln.transforms` has the
offline transforms, `kiln.reader` the augmentation ops). Registering a
function derives a frozen pydantic model from its keyword-only parameters
and their annotations; `Registry.parse` validates a list against those
models into `Spec`s: the name and the parameters, defaults filled in,
frozen, picklable and JSON-serialisable (`Spec.to_json` is the resolved
entry that configs and ``kiln.json`` store). A mistake is reported with the
list, the entry's index, the name and the parameter, e.g.
``augment[0].random_crop.size: expected a positive integer or [height, width], got 'big'``.

Parameters are declared with pydantic annotations (``Annotated[float,
Field(ge=0)]``, ``Literal[...]``) and the kiln types shared by both halves,
defined here once: `Size`, `HeightWidth`, `Probability`, `Range` (for
parameters named ``*_range``) and `Choice`. Plain ``bool``, ``int``,
``float`` and ``str`` annotations are strict: ``"64"`` or ``true`` where a
number belongs is a config mistake, not 64 or 1.

Plain Python and pydantic only: the build job and the reader both import
this module, and it imports neither's libraries (TensorFlow, Beam, OpenCV).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import numbers
import os
import re
import sysconfig
import traceback
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Generic, TypeVar

import pydantic
from pydantic import Field, PlainValidator
from pydantic_core import ErrorDetails, core_schema

from kiln.errors import close_names, did_you_mean, quote, unexpected

logger = logging.getLogger(__name__)

# --- parameter types ---------------------------------------------------------------


def is_integer(value: Any) -> bool:
    """An integer of a config or a manifest: bool is an int subclass, but
    ``size: true`` is a mistake, not 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number of a config or a manifest (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _size(value: Any) -> int | tuple[int, int]:
    if is_integer(value) and value > 0:
        return int(value)
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(is_integer(v) and v > 0 for v in value)
    ):
        height, width = int(value[0]), int(value[1])
        # A square is one int however it is written: ``[64, 64]`` and ``64``
        # are one config, so one fingerprint and one version.
        return height if height == width else (height, width)
    raise ValueError(f"expected a positive integer or [height, width], got {value!r}")


def _height_width(value: Any) -> tuple[int, int]:
    size = _size(value)
    return (size, size) if isinstance(size, int) else size


# One validator per union (not pydantic's Union) so a mistake gets one message
# saying what is expected instead of one per union branch.
Size = Annotated[int | tuple[int, int], PlainValidator(_size)]
"""One positive int (a square) or ``[height, width]``, in one canonical form:
an int for a square (``[64, 64]`` becomes ``64``), else the pair. A resolved
config reads like its YAML, and two spellings of one size are one config (one
fingerprint, one version)."""

HeightWidth = Annotated[tuple[int, int], PlainValidator(_height_width)]
"""What `Size` accepts, always as ``(height, width)``: ``56`` becomes ``(56, 56)``."""

Probability = Annotated[float, pydantic.Strict(), Field(ge=0.0, le=1.0)]
"""A chance in [0, 1]."""


class _Validator:
    """A pydantic annotation that validates with ``self.validate`` (raising ValueError)."""

    def validate(self, value: Any) -> Any:
        raise NotImplementedError

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)


@dataclasses.dataclass(frozen=True)
class Range(_Validator):
    """``[low, high]`` with ``low <= high``, both within ``[minimum, maximum]``, as two floats.

    For parameters named ``*_range``:
    ``scale_range: Annotated[tuple[float, float], Range(0.0, 1.0)] = (0.08, 1.0)``.

    Attributes:
      minimum: Lowest allowed end (None: unbounded).
      maximum: Highest allowed end (None: unbounded).
      positive: Both ends must be above 0 (for ratios, whose logarithm is taken).
    """

    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False

    def validate(self, value: Any) -> tuple[float, float]:
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(is_number(v) for v in value)
        ):
            raise ValueError(f"expected two numbers [low, high], got {value!r}")
        low, high = float(value[0]), float(value[1])
        if low > high:
            raise ValueError(f"expected low <= high, got {list(value)!r}")
        for end in (low, high):
            if self.minimum is not None and end < self.minimum:
                raise ValueError(f"must be >= {self.minimum}, got {end!r}")
            if self.maximum is not None and end > self.maximum:
                raise ValueError(f"must be <= {self.maximum}, got {end!r}")
            if self.positive and end <= 0:
                raise ValueError(f"both ends must be > 0, got {list(value)!r}")
        return (low, high)


@dataclasses.dataclass(frozen=True)
class Choice(_Validator):
    """One of a fixed set of strings: ``method: Annotated[str, Choice(("area", "linear"))]``."""

    options: tuple[str, ...]

    def validate(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.options:
            raise ValueError(f"expected one of {list(self.options)}, got {value!r}")
        return value


# --- registered functions and configured entries -------------------------------------


class ListError(ValueError):
    """A list of transforms or ops is invalid.

    Every problem of the list is found, not only the first: `problems` has
    one line per wrong entry or parameter, each naming it
    (``transforms[1].resize.size: ...``). The message is the single problem,
    or all of them, one per line, under a line that counts them.
    """

    def __init__(self, *problems: str):
        self.problems = problems
        if len(problems) == 1:
            super().__init__(problems[0])
        else:
            lines = [f"{len(problems)} problems:", *(f"  {problem}" for problem in problems)]
            super().__init__("\n".join(lines))


@dataclasses.dataclass(frozen=True)
class Registered:
    """A function registered under a name.

    Attributes:
      name: What lists use.
      fn: The function; its keyword-only parameters are the configurable ones.
      parameters: The frozen pydantic model of those parameters.
      check: Optional ``check(**params)`` for rules between parameters (e.g.
        "exactly one of size and to_square") that annotations cannot
        express; raises ValueError with a message naming the parameters.
      notes: What a parameter means, by name, said after any error about
        it; a name the function does not take may have one too, for a
        parameter of the same idea elsewhere (Keras' ``factor`` of a
        rotation, in turns, where kiln's ``angle_range`` is in degrees).
    """

    name: str
    fn: Callable[..., Any]
    parameters: type[pydantic.BaseModel]
    check: Callable[..., None] | None = None
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One list entry, validated: a registered name and its parameters.

    Holds the name, not the function, so it is picklable and rebuilt from
    `to_json` in another process; parameters are sorted by name, with
    defaults filled in, so equal configs give equal specs.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        """The resolved entry, ``{name: {param: value}}``, tuples as lists."""
        return {self.name: _jsonable(self.kwargs)}


F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound=Registered)
S = TypeVar("S", bound=Spec)

_NO_DEFAULT = inspect.Parameter.empty


def parameter_model(
    kind: str, name: str, fn: Callable[..., Any], leading: Sequence[str]
) -> type[pydantic.BaseModel]:
    """The frozen model of `fn`'s configurable parameters.

    Args:
      kind: What `fn` is, for messages (``"offline transform"``).
      name: Its registered name, for messages.
      fn: ``fn(<leading>, *, param: type = default, ...)``.
      leading: Names of the positional parameters that carry the data (the
        image, a seed), which a config does not set.

    Raises:
      ValueError: if the signature has another shape, or a parameter has no
        annotation.
    """
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < len(leading):
        raise ValueError(
            f"{kind} {name!r}: expected the signature fn({', '.join(leading)}, *, "
            f"param=default, ...); got {len(positional)} positional parameter(s)"
        )
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # what a wrong annotation raises depends on the annotation
        # Validating without the annotations would let every value through.
        raise ValueError(
            f"{kind} {name!r}: cannot resolve the parameter annotations: {type(e).__name__}: {e}"
        ) from e
    # Any: mypy would match `**fields` against create_model's own keywords
    # (__base__, __module__...); each value is an (annotation, default) pair.
    fields: dict[str, Any] = {}
    for param in params[len(leading) :]:
        if param.kind is not param.KEYWORD_ONLY:
            raise ValueError(
                f"{kind} {name!r}: parameter {param.name!r} must be keyword-only "
                f"(put it after a bare '*')"
            )
        if param.name not in hints:
            # Without one a config's value would pass unchecked ("x" for a
            # count), to fail (or not) inside the op, at its first use.
            raise ValueError(
                f"{kind} {name!r}: parameter {param.name!r} has no type annotation: "
                f"annotate it (e.g. '{param.name}: int'), which validates the values "
                f"configs give it ('typing.Any' accepts every value)"
            )
        default = ... if param.default is _NO_DEFAULT else param.default
        fields[param.name] = (_strict_scalars(hints[param.name]), default)
    return pydantic.create_model(
        f"{name}_parameters",
        __config__=pydantic.ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True),
        **fields,
    )


_SCALARS = (bool, int, float, str)


def _strict_scalars(annotation: Any) -> Any:
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
    else:
        base, metadata = annotation, []
    if base not in _SCALARS:
        return annotation
    # Strict first, on the scalar itself: later metadata may replace the
    # scalar's validation altogether (a `Choice`, a PlainValidator).
    return Annotated[(base, pydantic.Strict(), *metadata)]


class Registry(Generic[R]):
    """The registered functions of one kind, and the parsing of lists that name them.

    Args:
      kind: What the functions are, for messages (``"augmentation op"``).
      noun: Its short form (``"op"``), for messages about list entries.
      error: The `ListError` subclass raised for invalid lists.
      entry: The `Registered` (sub)class every registration records, built
        with the name, the function, its parameter model and the details
        given to `register`.
      own: How a function of one's own gets registered: said after the
        known names when an unknown name is close to none of them (it is
        most likely one's own, not registered where it is looked up).
      elsewhere: What to use instead of a name that is not registered but
        is one a user brings from elsewhere (Keras' ``Resizing`` in an
        augmentation list), said in place of the known names and of
        names merely close to it (``RandomTranslation`` is not a
        ``random_rotation``); only registered names that begin with it
        (an abbreviation) are offered instead. Keyed by the
        name in lower case without ``_`` and ``-`` (`fold_name`), so that
        ``Resizing``, ``resizing`` and ``RESIZING`` all find it.
    """

    def __init__(
        self,
        kind: str,
        noun: str,
        error: type[ListError],
        entry: Callable[..., R],
        own: str = "",
        elsewhere: Mapping[str, str] | None = None,
    ):
        self.kind = kind
        self.noun = noun
        self.error = error
        self._entry = entry
        self._own = own
        self._elsewhere = {fold_name(name): note for name, note in (elsewhere or {}).items()}
        self._entries: dict[str, R] = {}

    def register(
        self, name: str | None, *, leading: Sequence[str], **details: Any
    ) -> Callable[[F], F]:
        """A decorator that registers its function as `name` (default: the function's name).

        Args:
          name: What lists use.
          leading: The function's positional data parameters (see `parameter_model`).
          details: The entry's other fields (``check``, and those of the
            registry's `Registered` subclass).

        Raises:
          ValueError: if the name is taken by another function or the
            signature is not ``fn(<leading>, *, param: type = default, ...)``.
        """

        def decorator(fn: F) -> F:
            entry_name = name or fn.__name__
            parameters = parameter_model(self.kind, entry_name, fn, leading)
            self.add(self._entry(name=entry_name, fn=fn, parameters=parameters, **details))
            return fn

        return decorator

    def add(self, entry: R) -> None:
        """Registers `entry`; registering the same function again is a no-op.

        Raises:
          ValueError: if another function has the name.
        """
        existing = self._entries.get(entry.name)
        if existing is not None and existing.fn is not entry.fn:
            raise ValueError(
                f"{_article(self.kind)} {self.kind} named {entry.name!r} is already registered"
            )
        self._entries[entry.name] = entry

    def remove(self, name: str) -> None:
        """Forgets `name` (so a test can register its own function under it)."""
        del self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> R:
        if name not in self._entries:
            raise self.error(self._unknown(name))
        return self._entries[name]

    def _unknown(self, name: Any) -> str:
        hint = did_you_mean(name, self.names()) if isinstance(name, str) else ""
        note = self._elsewhere.get(fold_name(name)) if isinstance(name, str) else None
        # The note was written for this very name; only registered names it
        # begins (an abbreviation: random_flip) are likelier meant.
        if note and not any(known.startswith(name) for known in self.names()):
            return f"unknown {self.kind} {quote(name)}; {note}"
        if not hint:
            hint = _known(self.names()) + (f"; {self._own}" if self._own else "")
        return f"unknown {self.kind} {quote(name)}{hint}"

    def parse(
        self,
        specs: Iterable[Any] | None,
        field: str,
        make: Callable[[str, tuple[tuple[str, Any], ...]], S],
    ) -> list[S]:
        """Validates a list in YAML form; returns one ``make(name, params)`` per entry.

        Args:
          specs: The list; None means an empty one.
          field: Where the list is, for messages (``"transforms"``).
          make: Builds the entry (a `Spec` subclass) from the name and the
            validated parameters.

        Raises:
          self.error: naming each entry and parameter that is wrong
            (``augment[1].random_crop.size: ...``), all of them at once.
        """
        if specs is None:
            return []
        if isinstance(specs, (str, Mapping)) or not isinstance(specs, Iterable):
            raise self.error(f"{field}: expected a list of {self.noun}s, got {quote(specs)}")
        entries: list[S] = []
        problems: list[str] = []
        for index, spec in enumerate(specs):
            try:
                entries.append(make(*self._parse_entry(f"{field}[{index}]", spec)))
            except ListError as e:  # this entry's problems; the next entries are checked too
                problems.extend(e.problems)
        if problems:
            raise self.error(*problems)
        return entries

    def _parse_entry(self, where: str, spec: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
        raw: Any  # the parameters as written, checked to be a mapping below
        if isinstance(spec, str):
            name, raw = spec, {}
        elif isinstance(spec, Mapping) and len(spec) == 1:
            name, raw = next(iter(spec.items()))
            raw = {} if raw is None else raw
        else:
            raise self.error(
                f"{where}: expected {_article(self.noun)} {self.noun} name or a one-key mapping "
                f"{{name: {{params}}}}, got {quote(spec)}"
            )
        if not isinstance(name, str) or name not in self._entries:
            raise self.error(f"{where}: {self._unknown(name)}")
        if not isinstance(raw, Mapping):
            raise self.error(f"{where}.{name}: parameters must be a mapping, got {quote(raw)}")
        return name, self._validate(f"{where}.{name}", self._entries[name], raw)

    def _validate(self, where: str, entry: R, raw: Mapping) -> tuple[tuple[str, Any], ...]:
        try:
            model = entry.parameters.model_validate(dict(raw))
        except pydantic.ValidationError as e:
            known = list(entry.parameters.model_fields)
            errors = unknown_names_first(e.errors(include_url=False), lambda _: known)
            raise self.error(
                *(
                    f"{where}.{'.'.join(str(part) for part in error['loc'])}: "
                    f"{describe_error(error, known=known, noun='parameter')}"
                    f"{_note(entry, error['loc'])}"
                    for error in errors
                )
            ) from None
        params = {name: _frozen(getattr(model, name)) for name in type(model).model_fields}
        if entry.check is not None:
            try:
                entry.check(**params)
            except ValueError as e:
                raise self.error(f"{where}: {e}") from None
        return tuple(sorted(params.items()))


def fold_name(name: str) -> str:
    """`name` in lower case without ``_`` and ``-``: how `Registry` matches names from elsewhere."""
    return name.lower().replace("_", "").replace("-", "")


def _note(entry: Registered, location: tuple[int | str, ...]) -> str:
    """The entry's note on the parameter an error is about, as the message's last clause."""
    note = entry.notes.get(str(location[0])) if location else None
    return f"; {note}" if note else ""


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_EXPECTED = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
}


def import_plugin(module: str) -> str | None:
    """Imports a user's module so that its ``@register`` calls run (a
    config's ``plugins``, ``kiln preview --plugin``): None, or what went
    wrong, on one line.

    A module that is not found, or fails to import one of its own, is
    ``cannot import module 'm': <why>``. A module whose own code raises while
    it is imported (a setting it reads, a file it opens) is the user's code to
    fix, not a bug of kiln's, so it is a config problem too, naming the
    exception and the file and line it was raised at; the traceback is
    logged at DEBUG (``--verbose``). So is a module that calls ``sys.exit()``
    (``raised SystemExit: <its argument>``): left to propagate, its argument
    would become kiln's exit code (3, "busy") or a bare line, and no
    ``--report`` would be written. A KeyboardInterrupt is the user's Ctrl-C
    and propagates.
    """
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"cannot import module {module!r}: {e}{_where_plugins_are_found(module, e)}"
    except (Exception, SystemExit) as e:
        logger.debug("importing module %r raised", module, exc_info=True)
        return (
            f"importing module {module!r} raised {unexpected(e)} "
            f"({_raised_at(e)}--verbose prints the traceback)"
        )
    return None


def _where_plugins_are_found(module: str, error: ImportError) -> str:
    """What to do when `module` itself (or a package it is in) is not found,
    as opposed to a module it imports: '' for the latter.

    The ``kiln`` command's ``sys.path`` holds no current directory, while
    ``python -m kiln`` puts it first, so a plugin beside the config imports
    with one and not the other; say so when that is the case, since the text
    promises the two are the same command."""
    if not isinstance(error, ModuleNotFoundError) or error.name is None:
        return ""
    if not (module == error.name or module.startswith(error.name + ".")):
        return ""
    top = os.path.join(os.getcwd(), error.name.replace(".", os.sep))
    if os.path.isdir(top) or os.path.isfile(top + ".py"):
        return (
            "; it is in the current directory, which the kiln command does not import from "
            "(python -m kiln does): add the folder to PYTHONPATH (PYTHONPATH=. kiln ...), "
            "which Beam's worker processes read too"
        )
    return (
        "; plugins are imported from sys.path: install the package that holds it, "
        "or add its folder to PYTHONPATH"
    )


def _raised_at(error: BaseException) -> str:
    """``file.py, line 7; ``: the last frame of `error`'s traceback in the
    user's code, i.e. outside Python's library, installed packages and kiln (a
    KeyError of ``os.environ[...]`` is raised in os.py, but the user's line
    is what to fix), else the last one of a file (a plugin installed as a
    package); '' if there is none."""
    paths = sysconfig.get_paths()
    folders = [paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    folders.append(os.path.dirname(__file__))  # kiln's own frames, wherever it is installed
    library = tuple(os.path.join(os.path.realpath(folder), "") for folder in folders)
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<")
    ]
    users = [f for f in frames if not os.path.realpath(f.filename).startswith(library)]
    if not users and isinstance(error, SyntaxError):
        # A plugin that does not compile: its message names the file and line
        # already, and its traceback holds only the import machinery's frames
        # (importlib/__init__.py), no line of the user's to name.
        return ""
    for frame in (users or frames)[-1:]:
        return f"{os.path.basename(frame.filename)}, line {frame.lineno}; "
    return ""


def unknown_names_first(
    errors: Sequence[ErrorDetails], known: Callable[[tuple[int | str, ...]], Sequence[str]]
) -> list[ErrorDetails]:
    """Validation errors with unknown names first, each usually a typo of a
    name reported missing, and without a missing name that an unknown one's
    did-you-mean offers (``rot: unknown field; did you mean 'root'?`` says
    all there is: ``root: required field is missing`` would count one
    mistake twice). `known` gives the names valid in a location's section.
    """
    offered = {
        (*error["loc"][:-1], name)
        for error in errors
        if error["type"] == "extra_forbidden" and error["loc"]
        for name in close_names(str(error["loc"][-1]), known(tuple(error["loc"][:-1])))
    }
    return sorted(
        (e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in offered)),
        key=lambda error: error["type"] != "extra_forbidden",
    )


def describe_error(error: ErrorDetails, *, known: Sequence[str] = (), noun: str = "field") -> str:
    """One pydantic validation error in kiln's words: what was expected, and what was given.

    kiln's config models and the parameters of transforms and ops share it,
    so a mistake reads the same wherever it is made: ``expected a number,
    got 'lots'``, ``must be <= 1, got 1.5``, ``unknown parameter; did you
    mean 'size'?``.

    Args:
      error: One of `pydantic.ValidationError.errors()`.
      known: The names valid where the error is, for an unknown name's
        did-you-mean (and the list of them when none is close).
      noun: What the names are (``"field"``, ``"parameter"``).
    """
    kind, context = error["type"], error.get("ctx") or {}
    given = _as_written(error.get("input"))
    if kind == "missing":
        return f"required {noun} is missing"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1]) if error["loc"] else ""
        return f"unknown {noun}{did_you_mean(name, known) or _known(known)}"
    if kind == "value_error":
        return str(context["error"])
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {given}"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        return f"must be {sign} {context[key]}, got {given}"
    if kind == "literal_error":
        value = error.get("input")
        # pydantic gives the choices as their reprs: 'jpeg', 'png' or 'raw'.
        choices = re.findall(r"'([^']*)'", str(context["expected"]))
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        return f"expected {context['expected']}, got {given}{hint}"
    if kind == "string_too_short" and context.get("min_length") == 1:
        return "must not be empty"
    message = error["msg"]
    if message.startswith("Input should be "):
        return f"expected {message[len('Input should be ') :]}, got {given}"
    return message


def _known(names: Sequence[str]) -> str:
    return f" (known: {', '.join(names) or 'none'})"


def _as_written(value: Any) -> str:
    """A value quoted as a config writes it: ``null``, ``true``, ``'lots'``, ``3``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return quote(value)


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


def _frozen(value: Any) -> Any:
    # Lists (from a list[...] annotation) become tuples: specs are hashable.
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
