#!/usr/bin/env bash
# The Debian packages the local cluster's node and its image build use, installed where they are missing:
# containerd (and its runc shim), runc, the CNI plugins (the loopback one), iptables (the Service address's NAT
# rule), buildah and mmdebstrap (infra/local/image.sh). Needs root and apt-get; otherwise one line naming what
# to install, and exit 1.
set -euo pipefail
declare -A tool_of=([containerd]=containerd [runc]=runc [containernetworking-plugins]=/usr/lib/cni/loopback
                    [iptables]=iptables [buildah]=buildah [mmdebstrap]=mmdebstrap)
missing=()
for pkg in "${!tool_of[@]}"; do
  tool="${tool_of[$pkg]}"
  if [[ "$tool" == /* ]]; then [ -e "$tool" ] || missing+=("$pkg"); else command -v "$tool" >/dev/null || missing+=("$pkg"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "error: the local cluster needs Debian's ${missing[*]}: apt-get install ${missing[*]} (as root)" >&2
  exit 1
fi
echo "packages: installing ${missing[*]} (Debian)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
