#!/bin/sh
exec "${CHFIND:-chfind}" -q "$@"
