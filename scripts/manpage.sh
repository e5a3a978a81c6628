#!/bin/sh
# Writes the manual page of a chfs-rs program on standard output, generated
# from its --help (the text of its clap definition), with the help of each
# subcommand for programs that have them (chfs, chfs-bench).
#
# usage: scripts/manpage.sh PROGRAM SECTION VERSION [SEE_ALSO] [DOC]
#   PROGRAM   the executable (a path); its page is named after its basename
#   SECTION   1 for commands, 8 for daemons (chfsd)
#   VERSION   printed in the page footer
#   SEE_ALSO  e.g. "chfsd(8), chlist(1)"
#   DOC       a longer document to name under SEE ALSO (e.g. the installed
#             doc/chfsctl.md)
# Needs only sh and a POSIX awk. Date: $SOURCE_DATE_EPOCH if set, else today.
set -eu

[ $# -ge 3 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
prog=$1
section=$2
version=$3
see_also=${4:-}
doc=${5:-}
name=$(basename "$prog")
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)
else
    date=$(date -u +%Y-%m-%d)
fi

help=$("$prog" --help) || { echo "manpage.sh: $prog --help failed" >&2; exit 1; }

# The conversion: clap's help layout (both its compact and its long form)
# and hand-written help in the same layout.
#   text before "Usage:"           -> NAME (first sentence) and DESCRIPTION
#   "Usage: ..." (+ indented lines) -> SYNOPSIS
#   "Heading:" alone on a line      -> a section (.SH, or .SS for a command)
#   in a section, a line indented by at most 6 columns starts an item
#   (.TP): its tag, then its description after two spaces or on the lines
#   indented more; other indented text is kept as it is laid out (.nf).
render() {
    awk -v name="$name" -v sub_cmd="${1:-}" '
function esc(s) {
    gsub(/\\/, "\\e", s)
    gsub(/-/, "\\-", s)
    if (s ~ /^[.\047]/) s = "\\&" s
    return s
}
function indent(s) { match(s, /^ */); return RLENGTH }
function trim(s) { sub(/^ +/, "", s); sub(/ +$/, "", s); return s }
function endverb() { if (verb) { print ".fi"; verb = 0 } }
function want_desc() { if (desc_pending) { print ".SH DESCRIPTION"; desc_pending = 0; fresh = 1 } }
function para() { want_desc(); endverb(); if (!fresh) print (initem ? ".IP" : ".PP"); fresh = 1 }
function text(s) {
    want_desc()
    if (s ~ /^ /) {
        if (!verb) { print ".nf"; verb = 1 }
        print esc(s)
    } else {
        endverb()
        print esc(s)
    }
    fresh = 0
}
function section(h) {
    endverb()
    desc_pending = 0
    if (sub_cmd != "") print ".SS " esc(h); else print ".SH " esc(toupper(h))
    initem = 0; fresh = 1
}
BEGIN { part = "about"; np = 0; fresh = 1 }
{
    line = $0
    sub(/[ \t]+$/, "", line)
    if (part == "about") {
        if (line ~ /^Usage: /) { part = "usage" }
        else {
            if (line == "") { if (buf != "") { paras[np++] = buf; buf = "" } }
            else buf = (buf == "" ? line : buf "\n" line)
            next
        }
    }
    if (part == "usage") {
        if (line ~ /^Usage: / || (line ~ /^       [^ ]/ && nus > 0)) {
            u = line; sub(/^Usage: /, "", u); u = trim(u)
            us[nus++] = u
            next
        }
        if (buf != "") { paras[np++] = buf; buf = "" }
        head()
        part = "body"
    }
    # body
    if (line ~ /^[A-Z][A-Za-z0-9 ]*:$/) { section(substr(line, 1, length(line) - 1)); initem = 1; next }
    if (line == "") { if (verb) endverb(); pend = 1; next }
    ind = indent(line)
    if (initem && ind >= 1 && ind <= 6) {
        endverb()
        rest = substr(line, ind + 1)
        tag = rest; desc = ""
        if (match(rest, /   *[^ ]/) && substr(rest, 1, 1) != " ") {
            # compact form: tag, two or more spaces, description
            tag = substr(rest, 1, RSTART - 1)
            desc = substr(rest, RSTART + RLENGTH - 1)
        }
        print ".TP"
        print "\\fB" esc(trim(tag)) "\\fR"
        if (desc != "") print esc(desc)
        fresh = 0; pend = 0; inpara = 1
        next
    }
    if (initem && ind > 6) {
        if (pend) { endverb(); print ".IP"; pend = 0 }
        s = trim(line)
        if (s ~ /^- / || s ~ /^\[/) { endverb(); print ".br" }
        print esc(s)
        fresh = 0
        next
    }
    if (initem && ind == 0) {
        # text after the items (clap after_help, or a hand-written epilogue)
        if (sub_cmd == "") { print ".SH NOTES" } else { print ".PP" }
        initem = 0; fresh = 1; pend = 0
    }
    if (pend) { para(); pend = 0 }
    text(line)
}
function head(   i, first, rest, k, n, p, pl) {
    first = (np > 0) ? paras[0] : ""
    gsub(/\n/, " ", first)
    rest = ""
    if (sub_cmd == "") {
        sub("^" name " (\342\200\224|-) ", "", first)   # "name — summary"
        if (match(first, /\. [A-Z`(]/)) { rest = substr(first, RSTART + 2); first = substr(first, 1, RSTART - 1) }
        sub(/\.$/, "", first)
        print ".SH NAME"
        print name " \\- " esc(first)
        print ".SH SYNOPSIS"
        print ".nf"
        for (i = 0; i < nus; i++) {
            p = us[i]; sub(/^[^ ]+/, "", p)
            print "\\fB" esc(substr(us[i], 1, length(us[i]) - length(p))) "\\fR" esc(p)
        }
        print ".fi"
        desc_pending = 1
    } else {
        print ".SH \"COMMAND " toupper(esc(sub_cmd)) "\""
        print esc(first)
        print ".PP"
        print ".nf"
        for (i = 0; i < nus; i++) print "\\fB" esc(us[i]) "\\fR"
        print ".fi"
    }
    fresh = 1
    if (rest != "") { want_desc(); print esc(rest); fresh = 0 }
    for (i = 1; i < np; i++) {
        para()
        n = split(paras[i], pl, "\n")
        for (k = 1; k <= n; k++) text(pl[k])
        endverb()
    }
}
END {
    if (part == "about") { if (buf != "") paras[np++] = buf; head() }
    endverb()
}
'
}

upper=$(printf '%s' "$name" | tr 'a-z' 'A-Z' | sed 's/-/\\-/g')
printf '.TH %s %s "%s" "chfs-rs %s" "chfs-rs manual"\n' "$upper" "$section" "$date" "$version"
printf '%s\n' "$help" | render
# Subcommands, in the order listed under "Commands:".
cmds=$(printf '%s\n' "$help" | awk '/^Commands:$/ { on = 1; next } /^[^ ]/ { on = 0 } on && /^  [a-z]/ { print $1 }')
for c in $cmds; do
    [ "$c" = help ] && continue
    "$prog" "$c" --help | render "$c"
done
if [ -n "$see_also" ] || [ -n "$doc" ]; then
    printf '.SH "SEE ALSO"\n'
    [ -n "$see_also" ] && printf '%s\n' "$see_also" | sed 's/-/\\-/g'
    if [ -n "$doc" ]; then
        [ -n "$see_also" ] && printf '.PP\n'
        printf '%s\n' "$doc" | sed 's/-/\\-/g'
    fi
fi
exit 0
