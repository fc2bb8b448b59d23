#!/usr/bin/env bash
# What the Mail tests (tests/it/mail.rs) need: Debian's Dovecot IMAP server (`dovecot-imapd`)
# and Postfix (`postfix`), installed with apt-get when missing (needs root). Idempotent.
#
# The tests never use the system's mail services: each test starts its own private Dovecot
# (`dovecot -F -c <its config>`, passwd-file accounts it makes, maildirs in a temp folder) and
# its own Postfix master (`master -c <its config dir> -d`, delivering into those maildirs with
# the virtual(8) agent, SMTP AUTH through a second Dovecot's auth service) on free ports. The
# packages' own services are not started by this script: the install runs under a
# policy-rc.d that refuses service starts when the host has none, and Postfix is installed
# with debconf's "No configuration".
#
# Prints the export lines scripts/test.sh evals:
#   MIRA_MAIL_DOVECOT=<dovecot binary>  MIRA_MAIL_POSTFIX=<postfix command>
#   MIRA_MAIL_POSTFIX_MASTER=<postfix master daemon>
set -euo pipefail
{
  need=()
  command -v dovecot >/dev/null 2>&1 || [ -x /usr/sbin/dovecot ] || need+=(dovecot-imapd)
  [ -x /usr/sbin/postfix ] || need+=(postfix)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup-mail: installing ${need[*]} (apt)"
    [ "$(id -u)" -eq 0 ] || { echo "setup-mail: ${need[*]} missing and not root; install them (apt-get install dovecot-imapd postfix)"; exit 1; }
    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      # Keep the packages' system services from starting during the install.
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod 755 /usr/sbin/policy-rc.d
      own_policy=1
    fi
    rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } || rc=$?
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
    [ "$rc" -eq 0 ] || { echo "setup-mail: apt-get install ${need[*]} failed"; exit "$rc"; }
  fi
  for user in postfix dovecot dovenull; do
    id "$user" >/dev/null 2>&1 || { echo "setup-mail: system user $user missing after install"; exit 1; }
  done
} >&2
dovecot=$(command -v dovecot || echo /usr/sbin/dovecot)
[ -x "$dovecot" ] || { echo "setup-mail: dovecot not found after install" >&2; exit 1; }
postfix=/usr/sbin/postfix
daemon_dir=$(/usr/sbin/postconf -h daemon_directory 2>/dev/null || echo /usr/lib/postfix/sbin)
[ -x "$daemon_dir/master" ] || { echo "setup-mail: postfix master not found in $daemon_dir" >&2; exit 1; }
echo "export MIRA_MAIL_DOVECOT=$dovecot"
echo "export MIRA_MAIL_POSTFIX=$postfix"
echo "export MIRA_MAIL_POSTFIX_MASTER=$daemon_dir/master"
