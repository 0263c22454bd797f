"""The layering rules of docs/contributing/architecture.md, checked on the source (imports inside functions
and under ``TYPE_CHECKING`` included): the wings by role, each importing only the wings below
it; three public doors for authors; 0 import circles."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "reconcilers"


def _modules() -> dict[str, Path]:
    out = {}
    for path in APP.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(APP.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> app modules it imports, module -> top-level packages it imports)."""
    modules = _modules()
    inner: dict[str, set[str]] = defaultdict(set)
    outer: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [f"{target}.{a.name}" for a in node.names]
                hits = [c for c in candidates if c in modules] or (
                    [target] if target in modules else [])
                inner[name].update(hits)
                outer[name].add(target.split(".")[0])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        inner[name].add(alias.name)
                    outer[name].add(alias.name.split(".")[0])
    return inner, outer


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


# The top of reconcilers/, bottom to top. A wing imports only itself and the layers below it;
# wings of one layer never import each other.
LAYERS: list[set[str]] = [
    {"_base", "devstack"},                      # shared words and settings; the local stack
    {"models"},                                 # the app's tables
    {"_kube"},                                  # the door to Kubernetes, the cache, ctx
    {"resources"},                              # typed custom resources (a public door)
    {"_authoring"},                             # what an author declares; manifests from it
    {"_queue"},                                 # the work ledger and what feeds it
    {"_web", "_watch", "_run", "_webhooks"},    # the roles: web, watcher, worker, webhooks
    {"api", "testing", "conf", "apps", "urls", "admin", "management"},  # the faces
    {"contrib"},                                # samples, written as a user writes them
]
WINGS = {"_base", "_kube", "_authoring", "_queue", "_web", "_watch", "_run", "_webhooks"}
# Three doors for authors, and one for a project's settings (``conf``).
PUBLIC = {"api", "resources", "testing", "conf"}
# Django finds these by name: the app config, models, admin, migrations, commands, templates and
# the URLs a project includes.
DJANGO = {"apps", "models", "admin", "migrations", "management", "templates", "urls"}
TOOLS = {"devstack", "contrib"}


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _layer(room: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room in rooms)


def test_the_top_of_the_app_is_its_wings_its_doors_and_djangos_places():
    entries = {p.stem if p.suffix == ".py" else p.name for p in APP.iterdir()
               if p.name not in ("__pycache__", "__init__.py", "py.typed")}
    assert entries == WINGS | PUBLIC | DJANGO | TOOLS
    private = {e for e in entries if e.startswith("_")}
    assert private == WINGS, "every wing is private by name; nothing else is"


def _upward(inner: dict[str, set[str]]) -> list[str]:
    """Each import of a wing of the same layer or one above (``module -> dep``)."""
    upward = []
    for module, deps in inner.items():
        room = _room(module)
        if room in ("", "migrations"):
            continue
        for dep in deps:
            other = _room(dep)
            if other in ("", room):
                continue
            if _layer(other) >= _layer(room):
                upward.append(f"{module} -> {dep}")
    return upward


def test_each_wing_imports_only_the_wings_below_it():
    inner, _ = _imports()
    assert _upward(inner) == []


def test_a_role_importing_another_role_is_found():
    """The roles - web, watcher, worker, webhooks - each keep their health and lifecycle in
    their own wing: one reaching into another's (or a shared room reaching up to one) fails."""
    planted = {"reconcilers._web.health": {"reconcilers._watch.health",
                                           "reconcilers._base.probes"},
               "reconcilers._run.health": {"reconcilers._web.health"},
               "reconcilers._base.probes": {"reconcilers._run.health"},
               "reconcilers.urls": {"reconcilers._web.health"}}
    assert sorted(_upward(planted)) == [
        "reconcilers._base.probes -> reconcilers._run.health",
        "reconcilers._run.health -> reconcilers._web.health",
        "reconcilers._web.health -> reconcilers._watch.health"]


def test_authors_samples_use_only_the_public_doors():
    """The bundled operators are written as a user writes one: ``reconcilers.api`` and
    ``reconcilers.resources``, never a wing's inside."""
    inner, _ = _imports()
    private = sorted(f"{m} -> {d}" for m, deps in inner.items() if _room(m) == "contrib"
                     for d in deps if _room(d) not in ("api", "resources", "contrib"))
    assert private == []


def test_the_public_doors_export_only_what_they_name():
    """``from reconcilers.api import *`` gives an author exactly its ``__all__``."""
    import reconcilers.api as api
    import reconcilers.conf as conf
    import reconcilers.resources as resources
    import reconcilers.testing as testing

    for door in (api, resources, testing, conf):
        assert door.__all__, door.__name__
        missing = [n for n in door.__all__ if not hasattr(door, n)]
        assert missing == [], door.__name__


def test_the_app_has_no_import_cycle():
    inner, _ = _imports()
    assert _cycles(inner) == []


def test_the_app_never_imports_the_project():
    _, outer = _imports()
    assert sorted(m for m, pkgs in outer.items() if "operator_project" in pkgs) == []


def test_only_the_kubernetes_door_imports_the_kubernetes_client():
    _, outer = _imports()
    assert sorted(m for m, pkgs in outer.items() if "kubernetes" in pkgs) == ["reconcilers._kube.kube"]


def test_the_shared_vocabulary_imports_nothing_of_the_app():
    inner, outer = _imports()
    assert inner["reconcilers._base.vocab"] == set()
    assert outer["reconcilers._base.vocab"] <= {"__future__", "dataclasses", "datetime", "typing"}


# The ledger's modules: the run's transitions, the reaper's pass, the rows' upkeep, and the
# cursor all three reach PostgreSQL through.
LEDGER = {f"reconcilers._queue.{m}" for m in ("ledger", "reaper", "upkeep", "cursor")}


def test_only_the_work_queue_drives_the_ledger():
    inner, _ = _imports()
    assert sorted(m for m, deps in inner.items()
                  if deps & LEDGER and m not in LEDGER) == ["reconcilers._queue.workqueue"]


def test_the_runner_has_no_celery():
    _, outer = _imports()
    assert "celery" not in outer["reconcilers._run.runner"]
    assert "celery" not in outer["reconcilers._queue.workqueue"]


def test_only_the_celery_side_imports_celery():
    """The sender (``broker``, through the project's app), the tasks, the worker's consumer
    and its health (the check that pings it included): the engine's core never depends on
    Celery."""
    _, outer = _imports()
    assert sorted(m for m, pkgs in outer.items() if pkgs & {"celery", "kombu"}) == [
        "reconcilers._queue.broker", "reconcilers._run.consumer", "reconcilers._run.health",
        "reconcilers._run.tasks"]


def test_only_the_metrics_module_imports_prometheus_client():
    """It must settle the multiprocess directory before prometheus_client is first imported."""
    _, outer = _imports()
    assert sorted(m for m, pkgs in outer.items() if "prometheus_client" in pkgs) == [
        "reconcilers._base.metrics"]
    inner, _ = _imports()
    assert inner["reconcilers._base.metrics"] == set()
    assert inner["reconcilers._base.probes"] <= {"reconcilers._base.metrics",
                                                 "reconcilers._base.tls"}
    assert inner["reconcilers._base.tls"] == set()


def test_the_local_stack_needs_only_the_standard_library():
    """``python3 -m reconcilers.devstack up`` runs before any virtualenv exists."""
    import sys

    inner, outer = _imports()
    stack = {m for m in outer if m.startswith("reconcilers.devstack")}
    assert stack
    for module in stack:
        assert inner[module] <= stack, module
        assert outer[module] - {"", "reconcilers"} <= set(sys.stdlib_module_names), module


# What a management command may do past declaring its arguments, in statements (imports,
# docstrings and argparse's declarations left out): check the arguments, make one call, say
# what came of it. The work is a wing's - ``watch`` hands its loop to ``_watch.lifecycle``,
# ``webhook`` its server to ``_webhooks.lifecycle`` - where it can be tested and reused
# without a command line.
COMMAND_STATEMENTS = 30
_DECLARATIONS = {"add_argument", "add_argument_group", "add_mutually_exclusive_group",
                 "add_parser", "add_subparsers"}


def command_statements(source: str) -> int:
    """The statements of a command module's ``source`` other than imports, docstrings,
    ``def``/``class`` lines and argument declarations (``parser.add_argument(...)``)."""
    def declaration(node: ast.stmt) -> bool:
        value = getattr(node, "value", None)
        return (isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign))
                and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr in _DECLARATIONS)

    def docstring(node: ast.stmt) -> bool:
        return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str))

    return sum(1 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.stmt)
               and not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                         ast.AsyncFunctionDef, ast.ClassDef))
               and not docstring(node) and not declaration(node))


def _fat_commands(sources: dict[str, str]) -> dict[str, int]:
    """The commands (name -> source) past ``COMMAND_STATEMENTS``, with their counts."""
    return {name: n for name, source in sources.items()
            if (n := command_statements(source)) > COMMAND_STATEMENTS}


def test_management_commands_stay_thin():
    commands = {p.stem: p.read_text() for p in (APP / "management" / "commands").glob("*.py")}
    assert "webhook" in commands and "watch" in commands
    assert _fat_commands(commands) == {}, (f"more than {COMMAND_STATEMENTS} statements past "
                                           "the arguments: move the work into its wing")


def _planted_command(statements: int, declarations: int) -> str:
    """A command module of ``statements`` counted statements (``pass`` and ``handle``'s
    writes) and ``declarations`` arguments."""
    lines = ['"""``manage.py planted``."""',
             "from django.core.management.base import BaseCommand", "", "",
             "class Command(BaseCommand):", "    def add_arguments(self, parser):"]
    lines += [f'        parser.add_argument("--option-{i}")' for i in range(declarations)]
    lines += ["        pass", "", "    def handle(self, *args, **options):",
              '        """Runs its own loop."""']
    lines += [f"        self.stdout.write('step {i}')" for i in range(statements - 1)]
    return "\n".join(lines) + "\n"


def test_a_command_doing_its_own_work_is_found_and_its_arguments_are_free():
    planted = {"works": _planted_command(COMMAND_STATEMENTS + 1, declarations=0),
               "declares": _planted_command(COMMAND_STATEMENTS, declarations=80)}
    assert _fat_commands(planted) == {"works": COMMAND_STATEMENTS + 1}


# Methods that change the container they are called on.
_MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem",
             "remove", "setdefault", "update"}


def _module_writes() -> list[str]:
    """Each statement that assigns (or deletes, or mutates in place) an attribute of another
    module of the app: ``runner.x = ...``, ``deadlines.x += ...``, ``runner.xs.add(...)``."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        bound: set[str] = set()  # local names of app modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                bound.update(a.asname or a.name for a in node.names
                             if f"{base}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                bound.update(a.asname for a in node.names if a.asname and a.name in modules)

        def other(target: ast.AST) -> bool:
            return (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id in bound)

        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in _MUTATORS):
                targets = [node.func.value]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if other(t):
                        found.append(f"{name}:{node.lineno}: {ast.unparse(t)}")
    return found


def test_no_module_assigns_into_another():
    """A module's functions and settings are its own: nothing is swapped in or added to from
    outside (at import time or later). What one part needs of another is passed - as the
    tasks pass Celery's soft-limit exception to the runner - or registered through a
    function the owner provides (``workqueue.set_sender``)."""
    assert _module_writes() == []


# What a user copies: the ready-to-run project and the docs. Neither may name a private module
# of the app, in an import or in a dotted path a setting holds (``LOGGING``'s ``"()"``).
USERS_COPY = [*(APP.parent / "operator_project").glob("*.py"), APP.parent / "README.md",
              *(APP.parent / "docs").rglob("*.md")]
_PRIVATE_PATH = re.compile(r"\breconcilers\._[a-z]")


def _private_paths(paths) -> list[str]:
    return [f"{path.name}:{n}: {line.strip()}" for path in paths
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if _PRIVATE_PATH.search(line)]


def test_the_project_and_the_docs_name_no_private_module():
    """A project's settings import ``reconcilers.conf``, its ``LOGGING`` names
    ``reconcilers.conf.JsonFormatter``; a private module may move in any release."""
    assert _private_paths(USERS_COPY) == []


# What a user reads as a user (not the contributors' pages, which walk the source): no
# private module's file either - it may move in any release, and a user has no reason to
# open it.
USERS_PAGES = [p for p in USERS_COPY if "contributing" not in p.parts]
_PRIVATE_FILE = re.compile(r"\breconcilers/_[a-z]")


def test_the_project_and_the_users_pages_point_into_no_private_file():
    assert [f"{p.name}:{n}" for p in USERS_PAGES
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if _PRIVATE_FILE.search(line)] == []
    assert _PRIVATE_FILE.search("defaults in ``reconcilers/_base/conf.py``")


def test_a_private_path_in_a_settings_string_is_found(tmp_path):
    planted = tmp_path / "settings.py"
    planted.write_text('LOGGING = {"formatters": {"json": {"()": '
                       '"reconcilers._base.logs.JsonFormatter"}}}\n'
                       'from reconcilers.conf import env_int\n')
    assert [p.split(":")[1] for p in _private_paths([planted])] == ["1"]


# The benchmark and the soak drive the operator as a user's project does: their apps are
# written as a user writes one, their harnesses start the operator's commands, and the soak's
# checker reads the cluster with the official client and the database through the models - a
# witness sharing the engine's client would share its faults. So neither imports a wing nor
# names one, dotted or as a file; a private module may move in any release.
BENCH_AND_SOAK = sorted(p for d in ("bench", "soak") for p in (APP.parent / d).rglob("*.py"))
_PRIVATE_FILE = re.compile(r"\breconcilers[./]_[a-z]")
# What measures the engine itself, which only its insides can name (file -> why).
ENGINE_MEASURES = {
    # py-spy names a sampled frame by its function and file; the stages of a run are told
    # apart by the engine's own files.
    "bench/profile.py": "groups py-spy's frames by the engine's files",
}


def _private_imports(path: Path, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
            if node.module == "reconcilers":
                names = [f"reconcilers.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [f"{name}:{node.lineno}: imports {n}" for n in names
                  if n.startswith("reconcilers._")]
    return found


def _bench_and_soak_privates(paths, root: Path = APP.parent) -> list[str]:
    found = []
    for path in paths:
        name = str(path.relative_to(root))
        found += _private_imports(path, name)
        if name not in ENGINE_MEASURES:
            found += [f"{name}:{n}: {line.strip()}"
                      for n, line in enumerate(path.read_text().splitlines(), 1)
                      if _PRIVATE_FILE.search(line)]
    return found


def test_the_bench_and_the_soak_use_only_the_public_doors():
    """Their apps, harnesses and checkers: ``reconcilers.api``, ``resources``, ``testing``,
    ``conf``, Django's places (``reconcilers.models``) and the local stack (``devstack``)."""
    assert len(BENCH_AND_SOAK) > 40, "the bench's and the soak's modules are found"
    assert _bench_and_soak_privates(BENCH_AND_SOAK) == []


def test_a_wing_imported_or_named_by_the_bench_or_the_soak_is_found(tmp_path):
    planted = tmp_path / "bench" / "impls" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text('"""Reads the cache (reconcilers/_kube/cache.py)."""\n'
                       "from reconcilers import _kube\n"
                       "from reconcilers._base.vocab import GVR\n"
                       "from reconcilers.api import GVR, Key\n"
                       "import reconcilers._run.runner as runner\n"
                       'TASK = "reconcilers._run.tasks.reconcile"\n')
    found = _bench_and_soak_privates([planted], tmp_path)
    assert sorted(int(p.split(":")[1]) for p in found) == [1, 2, 3, 3, 5, 5, 6]
    # What measures the engine may name its files, never import its modules.
    profile = tmp_path / "bench" / "profile.py"
    profile.write_text('STAGES = [("claim", "claim (reconcilers/_queue/ledger.py")]\n'
                       "from reconcilers._queue import ledger\n")
    assert [p.split(":")[1] for p in _bench_and_soak_privates([profile], tmp_path)] == ["2"]


# Each public door imported alone, in a program of its own, as an author's module or a
# project's settings would import it.
_IMPORT_ALONE = """
import json, os, sys, tempfile, threading
before = (dict(os.environ), sorted(os.listdir(tempfile.gettempdir())), threading.active_count())
import {door}
after = (dict(os.environ), sorted(os.listdir(tempfile.gettempdir())), threading.active_count())
print(json.dumps({{
    "environment": sorted(k for k in after[0] if before[0].get(k) != after[0][k]),
    "temporary": sorted(set(after[1]) - set(before[1])),
    "threads": after[2] - before[2]}}))
"""


def test_importing_a_public_door_changes_nothing_outside_the_program(tmp_path):
    """Django's rule: work belongs in ``AppConfig.ready()`` or in first use, never in an
    import. A project's ``settings.py`` imports ``reconcilers.conf``, an author's module
    ``reconcilers.api``, a test ``reconcilers.testing``; none of them may make a temporary
    directory, set an environment variable (which every program the process starts
    inherits) or start a thread."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("PROMETHEUS_MULTIPROC_DIR", "OPERATOR_METRICS_MADE_DIR")}
    env.update(TMPDIR=str(tmp_path), DJANGO_SETTINGS_MODULE="tests.settings")
    changes = {}
    for door in ("reconcilers.conf", "reconcilers.resources", "reconcilers.api",
                 "reconcilers.testing"):
        result = subprocess.run([sys.executable, "-c", _IMPORT_ALONE.format(door=door)],
                                cwd=APP.parent, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        changed = json.loads(result.stdout.splitlines()[-1])
        if changed != {"environment": [], "temporary": [], "threads": 0}:
            changes[door] = changed
    assert changes == {}


# Calls whose result is no state of the module's: a logger (logging's own), a compiled
# pattern, a type variable, an immutable collection, a sentinel.
_STATELESS_CALLS = {"getLogger", "compile", "TypeVar", "frozenset", "tuple", "object"}
_CONSTANT = re.compile(r"_*[A-Z][A-Z0-9_]*")  # never rebound nor changed, by convention


def _is_state(value: ast.AST | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name not in _STATELESS_CALLS
    return False


def _unowned_state(source: str, module: str = "module") -> list[str]:
    """Each module-level name holding state - a mutable container or a call's result (an
    object, a lock, a ``threading.local()``) under a name that is not a constant's, or any
    name a function rebinds through ``global`` - with no comment in its paragraph above it
    (or at its line's end) saying who writes it and why it lives at module level."""
    tree = ast.parse(source)
    lines = source.splitlines()
    rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global)
               for name in node.names}

    def statements(body):
        for node in body:
            yield node
            if isinstance(node, (ast.If, ast.Try)):
                yield from statements(node.body + node.orelse
                                      + getattr(node, "finalbody", []))

    def commented(node: ast.stmt, group_commented: bool) -> bool:
        if "#" in lines[node.end_lineno - 1] or group_commented:
            return True
        for line in reversed(lines[:node.lineno - 1]):
            if not line.strip():
                return False
            if line.lstrip().startswith("#"):
                return True
        return False

    found = []
    last_end, last_commented = 0, False  # the state statement before: one group, one comment
    for node in statements(tree.body):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [t.id for target in targets
                 for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                 if isinstance(t, ast.Name)]
        if names in (["__all__"], ["urlpatterns"]):  # Python's and Django's own names
            continue
        state = [n for n in names if n in rebound
                 or (_is_state(value) and not _CONSTANT.fullmatch(n))]
        if not state:
            continue
        ok = commented(node, last_commented and node.lineno == last_end + 1)
        if not ok:
            found.append(f"{module}:{node.lineno}: {', '.join(state)}")
        last_end, last_commented = node.end_lineno, ok
    return found


def test_module_level_state_says_who_owns_it():
    """Module-level state is shared by every thread of a process and inherited by every
    child it forks: each such name carries a comment stating who writes it and why it lives
    at module level, rather than in an object passed to its users (``reconcilers.testing``'s
    registries, ``workqueue.set_sender``) or made on first use (``metrics.settle``)."""
    found = []
    for name, path in sorted(_modules().items()):
        found += _unowned_state(path.read_text(), name)
    assert found == []


def test_unowned_module_level_state_is_found():
    planted = """import threading

log = logging.getLogger(__name__)
SIZES = {"a": 1}
_seen = {}

# Written by the watcher's thread alone.
_last = []
_lock = threading.Lock()

_local = threading.local()
_ready = False

_owner = None  # the first caller's thread
_owner_lock = threading.Lock()
_sizes = dict(SIZES)


def start():
    global _ready, _owner
    _ready = True
"""
    assert _unowned_state(planted) == ["module:5: _seen", "module:11: _local",
                                       "module:12: _ready"]


# The run's vocabulary has one home (``reconcilers._base.reconcile``): the ORM, the ledger,
# the runner and the admin import these words, and no other module defines one of them.
RUN_WORDS = {"Key", "Trigger", "State", "Outcome", "Result", "TemporaryError", "PermanentError",
             "ReconcileError", "Decision", "Dispatch", "Claim", "LeaseLost"}
VOCABULARY = "reconcilers._base.reconcile"


def _word_definitions(source: str, module: str = "module") -> list[str]:
    """Where ``source`` defines one of the run's words, or reads one from anywhere but its
    home."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name in RUN_WORDS:
            found.append(f"{module}:{node.lineno}: defines {node.name}")
        elif (isinstance(node, ast.ImportFrom) and not node.level
              and (node.module or "").startswith("reconcilers.") and node.module != VOCABULARY
              and node.module not in PUBLIC_IMPORTERS):
            for alias in node.names:
                if alias.name in RUN_WORDS:
                    found.append(f"{module}:{node.lineno}: imports {alias.name} from "
                                 f"{node.module}")
    return found


# The public doors hand authors the words a reconcile returns and raises; code inside the app
# takes them from their home.
PUBLIC_IMPORTERS = {"reconcilers.api"}


def test_the_runs_vocabulary_has_one_home():
    found = []
    for name, path in sorted(_modules().items()):
        if name != VOCABULARY:
            found += _word_definitions(path.read_text(), name)
    assert found == []
    inner, _ = _imports()
    for user in ("reconcilers.models", "reconcilers._queue.ledger", "reconcilers._run.runner"):
        assert VOCABULARY in inner[user], user


def test_a_second_home_for_a_run_word_is_found():
    planted = """from reconcilers._queue.ledger import Claim
from reconcilers._base.reconcile import Key
from reconcilers.api import Result


class Outcome(str):
    pass
"""
    assert _word_definitions(planted) == ["module:1: imports Claim from reconcilers._queue.ledger",
                                          "module:6: defines Outcome"]


# A module past this many lines holds more than one idea more often than not: split it where
# the ideas part (the ledger's transitions from its reaper; ``ctx`` from its reads).
MAX_LINES = 450


def _too_long(paths: dict[str, Path]) -> list[str]:
    return [f"{name}: {n} lines" for name, path in sorted(paths.items())
            if (n := len(path.read_text().splitlines())) > MAX_LINES]


def test_no_module_passes_the_line_limit():
    assert _too_long(_modules()) == []


def test_a_module_past_the_line_limit_is_found(tmp_path):
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    short.write_text("x = 1\n" * MAX_LINES)
    assert _too_long({"long": long, "short": short}) == [f"long: {MAX_LINES + 1} lines"]
# The tests mirror the rooms they test: a room's tests sit in one directory, each file named
# for a module of that room - test_<module>.py, or test_<module>_<topic>.py when a module has
# several - so a module's tests are found by its name, and a file named for no module (a
# topic, a module since renamed) is found here. A wing's tests are under tests/ by the wing's
# name without its underscore; the faces (the doors and Django's places) share tests/faces;
# the bench's and the soak's tests sit beside their code. tests/e2e/ is the whole system's and
# the test files at the top of tests/ are the whole house's: neither mirrors one room.
FACES = sorted((PUBLIC | DJANGO) - {"migrations", "templates"})
TEST_ROOMS: dict[str, list[str]] = {
    **{f"tests/{wing.lstrip('_')}": [f"reconcilers/{wing}"] for wing in sorted(WINGS)},
    "tests/faces": [f"reconcilers/{face}" for face in FACES],
    **{f"tests/{tool}": [f"reconcilers/{tool}"] for tool in sorted(TOOLS)},
    "tests/project": ["operator_project"],
    "bench/tests": ["bench"],
    "soak/tests": ["soak"],
}
WHOLE_SYSTEM = {"tests", "tests/e2e"}


def _room_modules(repo: Path, sources: list[str]) -> set[str]:
    """The module names of a room: each module (``x.py``) and package (``x/``) of its sources,
    at any depth, but none of a tests or migrations directory; and, in a room of several
    sources (the faces), each source's own name."""
    names: set[str] = set()
    for source in sources:
        path = repo / source
        if len(sources) > 1 and (path.is_dir() or path.with_suffix(".py").is_file()):
            names.add(path.name)
        if not path.is_dir():
            continue
        for found in path.rglob("*.py"):
            inner = found.relative_to(path).parts
            if {"tests", "migrations"} & set(inner):
                continue
            names.update(p for p in inner[:-1])
            names.add(found.stem)
    return names - {"__init__", "__main__"}


def misnamed_tests(repo: Path) -> list[str]:
    """Test files named for no module of the room they sit in, or outside every room."""
    found = []
    rooms = {repo / room: _room_modules(repo, sources) for room, sources in TEST_ROOMS.items()}
    places = [repo / "tests", *(repo / room for room in TEST_ROOMS)]
    for path in sorted({p for place in places if place.is_dir() for p in place.rglob("test_*.py")}):
        where = path.parent.relative_to(repo).as_posix()
        if where in WHOLE_SYSTEM or where.startswith("tests/e2e/"):
            continue
        modules = rooms.get(path.parent)
        name = path.stem.removeprefix("test_")
        if modules is None:
            found.append(f"{path.relative_to(repo)}: {where} mirrors no room of TEST_ROOMS")
        elif not any(name == m or name.startswith(f"{m}_") for m in modules):
            found.append(f"{path.relative_to(repo)}: names no module of "
                         f"{', '.join(TEST_ROOMS[where])}")
    return found


def test_each_test_file_is_named_for_a_module_of_its_room():
    assert misnamed_tests(APP.parent) == []


def test_a_test_file_named_for_no_module_is_found(tmp_path):
    for source in ("reconcilers/_queue/ledger.py", "reconcilers/_queue/workqueue.py",
                   "reconcilers/models.py", "soak/check.py"):
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_text("")
    for test in ("tests/queue/test_ledger.py", "tests/queue/test_workqueue_batches.py",
                 "tests/queue/test_locks.py", "tests/faces/test_models.py",
                 "tests/faces/test_ledger.py", "tests/stray/test_models.py",
                 "tests/e2e/test_anything.py", "tests/test_whole_house.py",
                 "soak/tests/test_check.py", "soak/tests/test_soak_checker.py"):
        (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / test).write_text("")
    assert [f.split(":")[0] for f in misnamed_tests(tmp_path)] == [
        "soak/tests/test_soak_checker.py", "tests/faces/test_ledger.py",
        "tests/queue/test_locks.py", "tests/stray/test_models.py"]
