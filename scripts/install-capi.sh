#!/usr/bin/env bash
# The former name of scripts/install.sh (same options: [--from DIR]
# [--benches] PREFIX), kept for the scripts and tests that call it.
exec bash "$(dirname "$0")/install.sh" "$@"
