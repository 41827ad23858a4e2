# The two commands a fresh machine needs (see README): `make demo` and `make test`.
# Both create the project's virtual environment on first use and install slashrt into it
# (compiling native/ through the package build). `make test` runs the host suite, then the
# RDMA suite (tests/rdma) inside one soft-RoCE VM, installing what that needs (see scripts/).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard native/*.c native/*.h)
	@# PySpark (tests/spark) needs a JVM: Java 17 from Debian when none is installed
	command -v java >/dev/null 2>&1 || (apt-get update && apt-get install -y openjdk-17-jre-headless)
	@# the Redis connectors' tests (tests/connectors) start their own redis-server on a free port:
	@# Debian's package, whose own service (port 6379) they neither need nor use, so it is disabled
	command -v redis-server >/dev/null 2>&1 || (apt-get update && apt-get install -y redis-server \
		&& (systemctl disable --now redis-server 2>/dev/null || service redis-server stop 2>/dev/null || true))
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/slashrt demo

# the host suite on two workers (pytest-xdist; tests that share a JVM or the netns subnets keep
# to one worker, tests/conftest.py): most tests wait for processes they started, so two use
# the two cores where one left the second mostly idle
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup
	bash scripts/rdma-tests.sh $(VENV)

clean:
	rm -rf $(VENV) build *.egg-info slashrt/*.so
