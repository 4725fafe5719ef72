#!/usr/bin/env bash
# Writes ../.vagrant-lab/known_hosts for inventories/vagrant.toml: each running VM's ed25519 host
# key, read over Vagrant's own authenticated SSH (never a scan trusted on first use), under the
# address the Vagrantfile gives it. Run from anywhere after `vagrant up`.
set -euo pipefail
cd "$(dirname "$0")"
const() { sed -n "s/^$1 = \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" Vagrantfile; }
n=$(const N) prefix=$(const IP_PREFIX) first=$(const FIRST_IP)
out=../.vagrant-lab/known_hosts
: >"$out.part"
for i in $(seq 1 "$n"); do
  key=$(vagrant ssh "h$i" -c 'cat /etc/ssh/ssh_host_ed25519_key.pub' 2>/dev/null | tr -d '\r') ||
    { echo "known-hosts: h$i does not answer: is it up (vagrant status)?" >&2; exit 1; }
  echo "$prefix$((first + i - 1)) $(echo "$key" | cut -d' ' -f1,2)" >>"$out.part"
done
mv "$out.part" "$out"
echo "known-hosts: $n host keys in $(cd .. && pwd)/.vagrant-lab/known_hosts" >&2
