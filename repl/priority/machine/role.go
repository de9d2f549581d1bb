package machine

import (
	"fmt"

	"github.com/lockd-dev/lockd/api"
)

// Role is a member's role in a priority cluster, as its heartbeats say it.
type Role uint8

// Roles.
const (
	RoleStandby  Role = 1 // follows an active (or none is known yet)
	RoleActive   Role = 2 // executes requests and streams its changes
	RoleHandover Role = 3 // an active handing its work to a successor: executes nothing
	RoleLeaving  Role = 4 // shutting down: count it as not live at once
)

var roleNames = [...]string{RoleStandby: api.RoleStandby, RoleActive: api.RoleActive, RoleHandover: api.RoleHandingOver, RoleLeaving: api.RoleLeaving}

// String names the role (as /status and the logs show it).
func (r Role) String() string { return NameOf(roleNames[:], uint8(r), "Role") }

// Valid reports whether r is a role a heartbeat may carry.
func (r Role) Valid() bool { return r >= RoleStandby && r <= RoleLeaving }

// HandState is where a planned handover stands, as its old active sees it.
type HandState uint8

// Handover states.
const (
	HandNone       HandState = iota // none since this member started
	HandOffered                     // the Handoff is out, no verdict yet: execute nothing
	HandTaken                       // the successor took it and serves: this member follows it
	HandRefused                     // the successor refused it: this member is the active again
	HandLost                        // the successor went silent first: a standby without an active
	HandSuperseded                  // another active prevailed over this member: it follows it
	HandUndecided                   // no verdict in time, the successor live: this member follows it, serving nothing
)

var handNames = [...]string{HandNone: "none", HandOffered: "offered", HandTaken: "taken", HandRefused: "refused",
	HandLost: "lost", HandSuperseded: "superseded", HandUndecided: "undecided"}

// String names the state.
func (h HandState) String() string { return NameOf(handNames[:], uint8(h), "HandState") }

// GateState is what the engine does with requests (repl.GateState's
// values, which the driver maps them onto).
type GateState uint8

// Gate states.
const (
	Serve    GateState = iota // execute requests
	Hold                      // execute nothing, answer nothing: requests wait
	Redirect                  // answer M naming Gate.To (-1: no active known)
)

var gateNames = [...]string{Serve: "serve", Hold: "hold", Redirect: "redirect"}

// String names the state.
func (g GateState) String() string { return NameOf(gateNames[:], uint8(g), "GateState") }

// NameOf names value v of a small enum from names (indexed by value, ""
// for none), or as typ(v).
func NameOf(names []string, v uint8, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}
