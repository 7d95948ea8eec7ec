#!/bin/bash
# Fails when a Catch2 test name would break ctest's discovery: catch_discover_tests splits on ';'
# (a CMake list separator) and a name starting with "--" is read as a flag, so such a test runs
# nothing and is reported as failed (or never runs). Usage: lint_test_names.sh BINARY...
status=0
for bin in "$@"; do
  while IFS= read -r name; do
    case "$name" in
      *\;* | --*) echo "$bin: test name not usable by ctest: $name"; status=1 ;;
    esac
  done < <("$bin" --list-test-names-only)
done
exit $status
