#!/usr/bin/env bash
# Install specd on this node: a `specd` system user, a virtualenv under /opt/specctl, the
# config in /etc/specd, the cluster token (0600, owned by specd) and the systemd unit.
# Run as root. Re-running it upgrades the package and keeps an existing config and token.
set -euo pipefail

PREFIX=/opt/specctl
CONFIG_DIR=/etc/specd
STATE_DIR=/var/lib/specd
UNIT_PATH=/etc/systemd/system/specd.service
SERVICE_USER=specd
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

SOURCE="$(dirname "$HERE")"
TOKEN_FILE=""
BIND="127.0.0.1"
START=1

usage() {
    cat <<USAGE
usage: install-specd.sh [--source DIR_OR_WHEEL] [--token-file PATH] [--bind ADDR] [--no-start]

  --source      specctl source tree or wheel to install (default: this checkout)
  --token-file  cluster token written by 'specctl init', installed as $CONFIG_DIR/cluster.token
  --bind        address specd listens on (default 127.0.0.1; use the node's private address
                so the operator machine can reach it)
  --no-start    install and enable, but do not start the service
USAGE
}

die() { echo "install-specd.sh: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --source) SOURCE="${2:?--source needs a value}"; shift 2 ;;
        --token-file) TOKEN_FILE="${2:?--token-file needs a value}"; shift 2 ;;
        --bind) BIND="${2:?--bind needs a value}"; shift 2 ;;
        --no-start) START=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ $EUID -eq 0 ]] || die "run as root (it creates a user and installs a systemd unit)"
[[ -e "$SOURCE" ]] || die "--source $SOURCE does not exist"
[[ -z "$TOKEN_FILE" || -r "$TOKEN_FILE" ]] || die "--token-file $TOKEN_FILE is not readable"
command -v python3 >/dev/null || die "python3 (3.11 or newer) is required"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "python3 must be 3.11+"

if ! id -u "$SERVICE_USER" >/dev/null 2>&1; then
    useradd --system --home-dir "$STATE_DIR" --no-create-home \
        --shell /usr/sbin/nologin "$SERVICE_USER"
fi
for group in video render; do
    if getent group "$group" >/dev/null; then usermod -a -G "$group" "$SERVICE_USER"; fi
done

install -d -m 0755 "$PREFIX"
[[ -x "$PREFIX/venv/bin/python" ]] || python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet --upgrade "$SOURCE"

install -d -m 0750 -o root -g "$SERVICE_USER" "$CONFIG_DIR"
install -d -m 0700 -o "$SERVICE_USER" -g "$SERVICE_USER" "$STATE_DIR"
if [[ ! -e "$CONFIG_DIR/specd.toml" ]]; then
    cat >"$CONFIG_DIR/specd.toml" <<TOML
# specd configuration; command-line flags override these. See docs/deploy-node.md.
host = "$BIND"
port = 7601
token_file = "$CONFIG_DIR/cluster.token"
state_dir = "$STATE_DIR"

[ray]
port = 6379
TOML
    chown root:"$SERVICE_USER" "$CONFIG_DIR/specd.toml"
    chmod 0640 "$CONFIG_DIR/specd.toml"
fi
if [[ -n "$TOKEN_FILE" ]]; then
    install -m 0600 -o "$SERVICE_USER" -g "$SERVICE_USER" "$TOKEN_FILE" "$CONFIG_DIR/cluster.token"
fi
[[ -e "$CONFIG_DIR/cluster.token" ]] \
    || echo "warning: no $CONFIG_DIR/cluster.token yet; specd will not start without it" >&2

install -m 0644 "$HERE/systemd/specd.service" "$UNIT_PATH"
systemctl daemon-reload
systemctl enable specd.service
if [[ $START -eq 1 ]]; then
    systemctl restart specd.service
    echo "specd started; check it with: systemctl status specd; journalctl -u specd"
fi
