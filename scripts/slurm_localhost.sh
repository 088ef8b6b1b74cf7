#!/usr/bin/env bash
# A real, single-node SLURM cluster on this one machine, so that meshrun's `slurm`-marked test
# can submit real jobs (sbatch/srun, Hydra's submitit launcher, jax.distributed's SLURM
# auto-detection). CI runs it before that test; it also works in a plain Debian 12 container
# without systemd. Needs root (or passwordless sudo, which it then uses): it installs packages,
# writes /etc/slurm/slurm.conf and starts munged, slurmctld and slurmd.
#
# Usage: scripts/slurm_localhost.sh [start|stop|status]
#   start  (default) install slurm-wlm + munge if missing, write /etc/slurm/slurm.conf for one
#          node ($(hostname -s), CPUs = nproc, partition `debug`), start munged, slurmctld and
#          slurmd in the background, wait until the node is idle and `srun -N1 -n2 hostname`
#          works. Idempotent: when the cluster is already up and healthy it says so and exits 0.
#   stop   stop the daemons (munged, slurmctld, slurmd) through their pid files.
#   status exit 0 if `srun -n2 true` works within ~20 s, else 1.
# Logs: /var/log/slurm/slurm{ctld,d}.log, /var/log/munge/munged.log.
set -euo pipefail

SLURM_CONF=/etc/slurm/slurm.conf
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
CTLD_PID=$RUN_DIR/slurmctld.pid
SLURMD_PID=$RUN_DIR/slurmd.pid
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid
PARTITION=debug
NODE=$(hostname -s)
WAIT_S=${SLURM_LOCALHOST_WAIT_S:-60}

log() { echo "slurm_localhost: $*"; }
die() { echo "slurm_localhost: ERROR: $*" >&2; exit 1; }

# True if the pid file names a live process whose command is $2 (guards against stale pid files
# whose pid was reused by something else). Reads /proc rather than `kill -0`, which a non-root
# caller may not send to root's daemons. A zombie counts as dead: a container's pid 1 may reap
# killed daemons late.
pid_alive() {
    local file=$1 comm=$2 pid stat
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    stat=$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) || return 1
    [[ $stat != Z && $stat != X ]]
}

installed() {
    command -v srun >/dev/null && command -v slurmctld >/dev/null &&
        command -v slurmd >/dev/null && command -v munged >/dev/null
}

srun_works() {  # $1: seconds; a 2-task step on the default partition
    timeout "$1" srun -N1 -n2 true >/dev/null 2>&1
}

healthy() {
    pid_alive "$MUNGE_PID" munged && pid_alive "$CTLD_PID" slurmctld &&
        pid_alive "$SLURMD_PID" slurmd && srun_works "${1:-20}"
}

ensure_installed() {
    installed && return 0
    local t0=$SECONDS pkgs=(slurm-wlm munge)
    log "installing ${pkgs[*]} (apt)..."
    export DEBIAN_FRONTEND=noninteractive
    # apt-get update only when the package lists do not know slurm-wlm yet, or when the install
    # fails (stale lists give 404s).
    if ! apt-cache show slurm-wlm >/dev/null 2>&1; then
        apt-get update -qq || die "apt-get update failed"
    fi
    if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/tmp/slurm_localhost_apt.log 2>&1; then
        apt-get update -qq || die "apt-get update failed"
        apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/tmp/slurm_localhost_apt.log 2>&1 ||
            die "apt-get install ${pkgs[*]} failed (see /tmp/slurm_localhost_apt.log)"
    fi
    installed || die "slurm-wlm/munge installed but srun/slurmctld/slurmd/munged not on PATH"
    log "installed in $((SECONDS - t0)) s"
}

start_munge() {
    if pid_alive "$MUNGE_PID" munged && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        mkdir -p "$(dirname "$MUNGE_KEY")"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$MUNGE_KEY"
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
        fi
    fi
    # munged refuses to start unless its key and dirs belong to its user and are not group/world
    # writable, so (re)assert that; /run is often a fresh tmpfs in containers.
    local user=root
    id munge >/dev/null 2>&1 && user=munge
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown "$user:" "$MUNGE_KEY" /run/munge /var/lib/munge /var/log/munge
    chmod 0400 "$MUNGE_KEY"
    chmod 0755 /run/munge
    chmod 0700 /var/lib/munge /var/log/munge
    rm -f "$MUNGE_PID" /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    # No systemd: start munged directly (it daemonizes). Run it as the munge user; as root it
    # would need --force.
    if [[ $user == munge ]]; then
        runuser -u munge -- munged || die "munged failed to start (see /var/log/munge/munged.log)"
    else
        munged --force || die "munged failed to start (see /var/log/munge/munged.log)"
    fi
    local i
    for ((i = 0; i < 50; i++)); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "munged started but 'munge -n | unmunge' fails (see /var/log/munge/munged.log)"
}

# Writes slurm.conf; returns 0 if it changed.
write_config() {
    local cpus mem_mb tmp
    cpus=$(nproc)
    # At least 2 CPUs so the 2-task test step always fits, even on a 1-CPU runner
    # (config_overrides below makes slurmd accept a CPU count above the hardware's).
    ((cpus < 2)) && cpus=2
    # Memory in MB from /proc/meminfo, minus 5% headroom: without RealMemory the node has 1 MB
    # and every job asking for memory (submitit's --mem, `mem_gb`) is rejected.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.95}' /proc/meminfo)
    mkdir -p "$(dirname "$SLURM_CONF")"
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Written by meshrun's scripts/slurm_localhost.sh: a single-node SLURM cluster on localhost for
# the slurm-marked test. Regenerated on every start; edit the script, not this file.
ClusterName=localhost
SlurmctldHost=${NODE}(127.0.0.1)
# Daemons run as root: no separate slurm user/permissions to set up inside a container.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups (containers rarely have a writable, delegated cgroup tree): track job processes by
# process group, bind no tasks, gather no accounting data.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd: no accounting storage (so sacct does not work).
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Cores are the consumable resource: two 1-CPU tasks share a 2-CPU node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Trust the CPU/memory given here over what slurmd detects (containers and VMs report odd
# topologies; a mismatch would otherwise drain the node).
SlurmdParameters=config_overrides
# A node that was DOWN comes back as soon as its slurmd registers (e.g. after a restart).
ReturnToService=2
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# No mail on a CI box; avoids errors about a missing mail program.
MailProg=/bin/true
InactiveLimit=0
KillWait=10
MinJobAge=300
SlurmctldTimeout=60
SlurmdTimeout=60
NodeName=${NODE} NodeAddr=127.0.0.1 NodeHostname=${NODE} CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
EOF
    # No cgroup.conf is written: with the plugins above slurmd never reads one (checked).
    if [[ -f $SLURM_CONF ]] && cmp -s "$tmp" "$SLURM_CONF"; then
        rm -f "$tmp"
        return 1
    fi
    mv "$tmp" "$SLURM_CONF"
    chmod 0644 "$SLURM_CONF"
    return 0
}

stop_pid() {  # $1 pid file, $2 command name
    local file=$1 comm=$2 pid i
    if pid_alive "$file" "$comm"; then
        pid=$(<"$file")
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped $comm (pid $pid)"
    fi
    rm -f "$file"
}

node_state() {
    sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1
}

# Re-runs this script as root through passwordless sudo (CI runners) when not root.
as_root() {
    [[ $(id -u) -eq 0 ]] && return 0
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        exec sudo -n bash "$0" "$@"
    fi
    die "'$1' needs root (or passwordless sudo) to install packages and start/stop daemons"
}

# srun/sbatch work through NodeAddr=127.0.0.1, but jax.distributed's SLURM auto-detection uses
# the node *name* from SLURM_STEP_NODELIST as the coordinator host, so it must resolve.
ensure_hostname_resolves() {
    getent hosts "$NODE" >/dev/null 2>&1 && return 0
    log "adding '127.0.0.1 $NODE' to /etc/hosts (the node name did not resolve)"
    echo "127.0.0.1 $NODE" >>/etc/hosts
}

cmd_start() {
    local t0=$SECONDS
    if installed && healthy 10; then
        log "already running and healthy (node $NODE, partition $PARTITION)"
        return 0
    fi
    as_root start
    ensure_installed
    ensure_hostname_resolves
    start_munge
    mkdir -p "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR"
    write_config && log "wrote $SLURM_CONF (node $NODE, CPUs $(nproc), partition $PARTITION)"
    if pid_alive "$CTLD_PID" slurmctld || pid_alive "$SLURMD_PID" slurmd; then
        # Running but `srun` failed above (stuck jobs after a crash, node down, old config).
        log "slurmctld/slurmd running but unhealthy: restarting them (clears all jobs)"
    fi
    # Always (re)start both from a clean slate: after a crash or kill the saved state holds jobs
    # that never finish (the node stays `allocated` and new jobs queue forever).
    stop_pid "$SLURMD_PID" slurmd
    stop_pid "$CTLD_PID" slurmctld
    # No systemd: start the daemons directly; both daemonize and write their pid files.
    # -c: clear saved jobs and node states (a throwaway test cluster keeps nothing).
    slurmctld -c || die "slurmctld failed to start (see $LOG_DIR/slurmctld.log)"
    slurmd || die "slurmd failed to start (see $LOG_DIR/slurmd.log)"

    local deadline=$((SECONDS + WAIT_S)) state=""
    while ((SECONDS < deadline)); do
        state=$(node_state)
        case $state in
            idle | mixed | allocated) break ;;
            # Left DOWN/DRAINED by an earlier run (e.g. killed daemons): bring it back.
            down* | drain* | fail*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 1
    done
    [[ $state =~ ^(idle|mixed|allocated)$ ]] ||
        die "node $NODE not idle after ${WAIT_S} s (state: '${state:-no answer from slurmctld}'; see $LOG_DIR/)"

    local out n
    out=$(timeout 60 srun -N1 -n2 hostname 2>&1) || die "'srun -N1 -n2 hostname' failed: $(echo "$out" | tail -n1)"
    n=$(grep -c . <<<"$out" || true)
    [[ $n -eq 2 ]] || die "'srun -N1 -n2 hostname' printed $n lines, expected 2: $(echo "$out" | tr '\n' ' ')"
    log "cluster up in $((SECONDS - t0)) s: node $NODE idle, partition $PARTITION, 'srun -N1 -n2 hostname' ok"
}

cmd_stop() {
    as_root stop
    stop_pid "$SLURMD_PID" slurmd
    stop_pid "$CTLD_PID" slurmctld
    stop_pid "$MUNGE_PID" munged
}

cmd_status() {
    if installed && srun_works 20; then
        log "healthy"
        return 0
    fi
    log "not healthy ('srun -n2 true' failed or timed out)"
    return 1
}

case ${1:-start} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) die "unknown command '$1' (use start, stop or status)" ;;
esac
