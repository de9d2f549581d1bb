package main

import (
	"flag"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl"
)

// membershipFlags adds the raft membership flags (docs/CLUSTER.md,
// "Changing a raft cluster's members" and "Disaster recovery").
func membershipFlags(fs *flag.FlagSet, m *repl.ClusterConfig) {
	fs.BoolVar(&m.Join, "join", false, "raft: on the first start of an empty --data-dir, join a running cluster (lockctl member add) instead of bootstrapping one from --peers")
	fs.BoolVar(&m.ForceNewCluster, "force-new-cluster", false, "raft, disaster recovery: restart this member from its own log as a new cluster of which it is the only member (a majority is lost for good); remove the flag once it serves")
}

// checkMembership refuses the membership flags outside raft mode.
func checkMembership(mode string, m *repl.ClusterConfig) error {
	if mode == api.ModeRaft {
		return nil
	}
	switch {
	case m.Join:
		return usageError{"--join needs --cluster raft (a priority cluster's members are its --peers)"}
	case m.ForceNewCluster:
		return usageError{"--force-new-cluster needs --cluster raft"}
	}
	return nil
}
