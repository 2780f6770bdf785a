#!/bin/sh
# SPDX-License-Identifier: MIT
# libodpd.so exports exactly the functions odpd.h declares, each at version
# node ODPD_1.0 of libodpd.map, and nothing else.
# Usage: test-abi.sh NM LIBODPD.so odpd.h
set -eu
nm=$1 lib=$2 header=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Declarations begin at column 0; comment lines begin with "/*" or " *".
grep -E '^[a-z].*[ *]odpd_[a-z0-9_]+\(' "$header" |
	sed -E 's/^.*[ *](odpd_[a-z0-9_]+)\(.*$/\1/' | sort -u >"$tmp/declared"
[ -s "$tmp/declared" ] || { echo "no declarations found in $header" >&2; exit 1; }

# "ADDR T name@@ODPD_1.0"; the version node itself shows up as an "A" symbol.
"$nm" -D --defined-only --with-symbol-versions "$lib" |
	awk '$2 != "A" { print $3 }' | sort -u >"$tmp/exported"

sed 's/$/@@ODPD_1.0/' "$tmp/declared" >"$tmp/expected"
if ! cmp -s "$tmp/expected" "$tmp/exported"; then
	echo "exported symbols differ from odpd.h's API at ODPD_1.0 (- expected, + exported):" >&2
	diff -u "$tmp/expected" "$tmp/exported" >&2 || true
	exit 1
fi
echo "ok: $(wc -l <"$tmp/exported") symbols, all ODPD_1.0"
