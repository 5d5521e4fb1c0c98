#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the tests of `--executor slurm` (and
# for trying the grid's Slurm path by hand). Needs root and Debian's packages:
#   apt-get install slurm-wlm munge            # the cluster
#   apt-get install slurmdbd mariadb-server    # accounting (`sacct`), optional
#
#   scripts/slurm_test_cluster.sh start DIR [accounting|none]   # idempotent
#   export SLURM_CONF=DIR/slurm.conf                             # then sinfo, sbatch, ...
#   scripts/slurm_test_cluster.sh stop DIR
#
# Everything (configuration, state, logs, the database) lives under DIR; the node has
# this machine's CPUs and memory (`slurmd -C`), one partition `debug` (the default).
# `none` runs without slurmdbd: `sacct` then fails as on a cluster without accounting.
# Exit status 3 (with the reason on stderr): this machine cannot run the cluster.
set -euo pipefail

usage() { echo "usage: $0 start|stop|status DIR [accounting|none]" >&2; exit 2; }
cannot() { echo "cannot start a Slurm test cluster: $*" >&2; exit 3; }
[ $# -ge 2 ] || usage
ACTION=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
MODE=${3:-accounting}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_all() {  # pid files: TERM to every daemon at once, wait up to 10 s, then KILL
  local pidfile pids=() pid i
  for pidfile in "$@"; do
    alive "$pidfile" && pids+=("$(cat "$pidfile")")
  done
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
  for pid in "${pids[@]}"; do
    for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$@"
}

stop() {
  [ -d "$DIR" ] || return 0
  if alive "$DIR/slurmctld.pid" && command -v scancel >/dev/null; then
    scancel --quiet --full "--user=$(id -un)" 2>/dev/null || true
  fi
  stop_all "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/slurmdbd.pid" \
    "$DIR/db-run/mariadb.pid" "$DIR/munged.pid"
}

ports() {  # a port block per folder, so two clusters' daemons never meet
  local base=$((20000 + $(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 20000))
  CTLD_PORT=$base; SLURMD_PORT=$((base + 1)); DBD_PORT=$((base + 2)); DB_PORT=$((base + 3))
}

write_conf() {
  local node cpus mem
  node=$(hostname -s)
  cpus=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -1)
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat > "$CONF" <<EOF
ClusterName=poskernel-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
KillWait=30
MinJobAge=300
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  if [ "$MODE" = accounting ]; then
    cat >> "$CONF" <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
EOF
  else
    echo "AccountingStorageType=accounting_storage/none" >> "$CONF"
  fi
}

start_munge() {
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    if [ ! -s /etc/munge/munge.key ] && command -v mungekey >/dev/null; then
      runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key \
        || cannot "no munge key, and mungekey could not create one"
    fi
    runuser -u munge -- /usr/sbin/munged || cannot "munged did not start"
    sleep 0.5
    cp /run/munge/munged.pid "$DIR/munged.pid"  # ours: stopped with the cluster
  fi
}

start_database() {  # MariaDB on a port of its own, then slurmdbd
  local db=$DIR/db run=$DIR/db-run i
  local sock=$run/mariadb.sock
  command -v mariadbd >/dev/null && command -v slurmdbd >/dev/null \
    || cannot "accounting needs: apt-get install slurmdbd mariadb-server"
  if ! alive "$run/mariadb.pid"; then
    mkdir -p "$run"
    if [ ! -d "$db/mysql" ]; then
      mkdir -p "$db"
      mariadb-install-db --user=root --datadir="$db" --auth-root-authentication-method=socket \
        > "$DIR/log/mariadb-install.log" 2>&1 || cannot "mariadb-install-db failed"
    fi
    mariadbd --user=root --datadir="$db" --socket="$sock" --port="$DB_PORT" \
      --bind-address=127.0.0.1 --pid-file="$run/mariadb.pid" --skip-log-bin \
      > "$DIR/log/mariadb.log" 2>&1 &
    for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ] || cannot "mariadbd did not start (see $DIR/log/mariadb.log)"
    mariadb --socket="$sock" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1'
      IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  fi
  cat > "$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/slurmdbd.conf"
  if ! alive "$DIR/slurmdbd.pid"; then
    SLURM_CONF=$CONF slurmdbd || cannot "slurmdbd did not start"
    for i in $(seq 100); do sacctmgr -i list cluster >/dev/null 2>&1 && break; sleep 0.1; done
    sacctmgr -i add cluster poskernel-test >/dev/null 2>&1 || true
  fi
}

start() {
  [ "$(id -u)" = 0 ] || cannot "needs root (the daemons run as root)"
  for b in slurmctld slurmd munged sinfo; do
    command -v "$b" >/dev/null || cannot "$b not found (apt-get install slurm-wlm munge)"
  done
  if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
    echo "running: export SLURM_CONF=$CONF"; return 0
  fi
  stop
  ports
  write_conf
  start_munge
  [ "$MODE" = accounting ] && start_database
  slurmctld -f "$CONF" || cannot "slurmctld did not start (see $DIR/log/slurmctld.log)"
  slurmd -f "$CONF" || cannot "slurmd did not start (see $DIR/log/slurmd.log)"
  local i
  for i in $(seq 150); do
    sinfo -h -o %T 2>/dev/null | grep -qx idle && break
    sleep 0.2
  done
  sinfo -h -o %T 2>/dev/null | grep -qx idle || cannot "the node is not idle: $(sinfo 2>&1)"
  echo "running: export SLURM_CONF=$CONF"
}

case $ACTION in
  start) start ;;
  stop) stop ;;
  status) alive "$DIR/slurmctld.pid" && sinfo ;;
  *) usage ;;
esac
