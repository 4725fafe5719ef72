#!/bin/sh
# Provisions one tfdeploy test VM: python3 with TensorFlow in /opt/tfdeploy/venv, and the lab key
# for root (the inventory logs in as root, like the namespace lab). $1 is the public key.
set -eu
export DEBIAN_FRONTEND=noninteractive
# The locally built box (build-box.sh) has all of it: then nothing is downloaded.
if ! dpkg -s python3 python3-venv rsync openssh-server >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 python3-venv rsync openssh-server
fi
if [ ! -x /opt/tfdeploy/venv/bin/python ]; then
  python3 -m venv /opt/tfdeploy/venv
  /opt/tfdeploy/venv/bin/python -m pip install -q --upgrade pip
  /opt/tfdeploy/venv/bin/python -m pip install -q "tensorflow-cpu==2.21.0" scikit-learn
fi
install -d -m 700 /root/.ssh
grep -qxF "$1" /root/.ssh/authorized_keys 2>/dev/null || echo "$1" >> /root/.ssh/authorized_keys
chmod 600 /root/.ssh/authorized_keys
# The deployer opens many handshakes and channels at once.
cat > /etc/ssh/sshd_config.d/tfdeploy.conf <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
MaxStartups 200
MaxSessions 200
CONF
systemctl reload ssh
