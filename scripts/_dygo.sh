# Shared by the scripts in this directory (sourced, not run): call the dygo API with curl.
#
#   DYGO_URL    the service, default http://127.0.0.1:8000
#   DYGO_TOKEN  a bearer token (admin for these scripts); not needed in development on localhost
#
# The reply (JSON) goes to stdout; an HTTP error also exits 1 with the status on stderr.

# The token reaches curl on its stdin, never as an argument, so it does not show in `ps`.
_dygo_curl() {
    if [ -n "${DYGO_TOKEN:-}" ]; then
        printf 'Authorization: Bearer %s\n' "$DYGO_TOKEN" | curl -H @- "$@"
    else
        curl "$@"
    fi
}

# dygo_call METHOD PATH [JSON_BODY]
dygo_call() {
    _url="${DYGO_URL:-http://127.0.0.1:8000}$2"
    _out=$(mktemp) || exit 1
    if [ $# -ge 3 ]; then
        _status=$(_dygo_curl -sS -o "$_out" -w '%{http_code}' -X "$1" \
            -H 'Content-Type: application/json' --data-binary "$3" "$_url")
    else
        _status=$(_dygo_curl -sS -o "$_out" -w '%{http_code}' -X "$1" "$_url")
    fi
    _code=$?
    if [ -s "$_out" ]; then cat "$_out"; echo; fi
    rm -f "$_out"
    [ "$_code" -eq 0 ] || exit 1
    case "$_status" in
        2??) return 0 ;;
        *) echo "dygo: $1 $2 answered HTTP $_status" >&2; exit 1 ;;
    esac
}

# usage "ARGS" "what it does": print and exit 2
usage() {
    echo "usage: $(basename "$0") $1" >&2
    echo "  $2" >&2
    echo "  env: DYGO_URL (default http://127.0.0.1:8000), DYGO_TOKEN (bearer token)" >&2
    exit 2
}

# require_id VALUE: a job id is digits only
require_id() {
    case "$1" in
        ''|*[!0-9]*) echo "dygo: job id must be a number, got '$1'" >&2; exit 2 ;;
    esac
}

# require_name VALUE: a queue name is kebab-case
require_name() {
    case "$1" in
        ''|*[!a-z0-9-]*) echo "dygo: queue name must be kebab-case, got '$1'" >&2; exit 2 ;;
    esac
}
