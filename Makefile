# The two commands: `make demo` runs the operator on a local stack, `make test` runs every test.
# Both install what they need (Debian packages, the control plane built from the Go module
# proxy, the Python virtualenv) and are safe to run again.

PYTHON := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: venv build up down status test demo lock clean

# The repository's own modules compiled too (as the image does), so no process started from
# this tree compiles them again at start-up where PYTHONDONTWRITEBYTECODE is set (~60 ms each).
venv:
	@bash hack/ensure-venv.sh
	@$(PYTHON) -m compileall -q reconcilers operator_project migrations bench soak tests

build:
	@bash reconcilers/devstack/build-control-plane.sh

up: venv
	@$(PYTHON) -m reconcilers.devstack up

down:
	@python3 -m reconcilers.devstack down

status:
	@python3 -m reconcilers.devstack status

test: up
	@bash hack/ensure-test-tools.sh
	$(PYTHON) -m pytest $(PYTEST_ARGS)

demo: up
	@$(PYTHON) -m operator_project.demo

# Re-resolve requirements.in (the image) and requirements-dev.in (plus the test tools) into
# their locks (needs PyPI). The image's lock is universal (markers, e.g. async-timeout below
# Python 3.11.3 for bookworm's 3.11.2) and hashed: the image installs it with --require-hashes.
# Pins already in the locks are kept; delete a line to let it move.
LOCK_PYTHON ?= 3.11
lock:
	rm -rf .local/lockvenv && python3 -m venv .local/lockvenv
	.local/lockvenv/bin/pip install --quiet uv
	grep -hE '^[A-Za-z]' requirements.lock | sed 's/ .*//' > .local/lock-pins.txt
	.local/lockvenv/bin/uv pip compile --quiet requirements.in --universal \
	  --python-version $(LOCK_PYTHON) --generate-hashes -c .local/lock-pins.txt \
	  --custom-compile-command "make lock" -o requirements.lock
	.local/lockvenv/bin/uv pip compile --quiet requirements-dev.in --universal \
	  --python-version $(LOCK_PYTHON) --no-annotate -c requirements.lock \
	  --custom-compile-command "make lock" -o requirements-dev.lock
	rm -rf .local/lockvenv .local/lock-pins.txt

clean: down
	rm -rf .local .venv

# Benchmarks against kopf, controller-runtime and the api-server ceiling on the local stack
# (docs/contributing/benchmarks.md), on a durable PostgreSQL of the bench's own. bench-quick is
# CI-sized: N=200 and 400, one repetition, minutes. bench: N=1,000 and 10,000, three
# repetitions, about an hour. Extra arguments: make bench BENCH_ARGS="--large" (N=30,000 too,
# the relist at N=10,000).
BENCH_ARGS ?=

.PHONY: bench bench-quick

bench: up
	$(PYTHON) -m bench $(BENCH_ARGS)

bench-quick: up
	$(PYTHON) -m bench --quick $(BENCH_ARGS)

# The chaos soak (docs/contributing/reliability.md): the whole operator under random faults,
# then an independent check from outside (the api-server, its audit log, the broker's
# messages); it writes its figures into docs/contributing/reliability.md. On a stack others
# use: SOAK_ARGS="... --faults proxy"
# The workers run the default layout's thread pool; --pool prefork for the other.
SOAK_ARGS ?= --minutes 10 --objects 300 --seed 42 --each-fault --write-docs --pool threads

.PHONY: soak

soak: up
	$(PYTHON) -m soak $(SOAK_ARGS)
