// Package api holds the JSON documents of lockd's admin endpoint and the
// names of its roles and modes: what the server serves (package admin
// encodes these types), and what every consumer decodes — lockctl, the
// cluster harness and its tests, the benchmark and chaos commands, and any
// program outside the module. It is the reference for the fields of
// /status and /keys/{key}; docs/ADMIN.md describes the endpoint around
// them.
//
// # What it owns
//
//   - Status (GET /status) with Limits, Member and RaftStatus; Key (GET
//     /keys/{key}) with every holder (KeyHolder) and waiter (KeyWaiter),
//     and KeyPath, which escapes a key for that path; Release (DELETE
//     /keys/{key}) with ReleasedGrant; Error (the body of a 4xx answer).
//   - A raft cluster's membership (members.go): Members (GET /members,
//     with RaftMember, which RaftStatus.Configuration carries too),
//     AddMember (POST /members), MemberChange (their answer) and
//     NotLeader (a 421: the change went to a member that does not lead).
//   - The names a document carries: the modes (ModeSingle, ModePriority,
//     ModeRaft) and roles (RoleActive, RoleStandby, RoleLeader, …), and
//     Serving, which tells the roles that execute requests.
//
// The field names on the wire are a contract: black-box suites and
// operators' scripts read them. A field may be added; none is renamed or
// removed. Tokens travel as decimal strings (u64 values above 2^53 do not
// survive JSON numbers in many languages).
//
// # Concurrency
//
// Plain data: a value is safe for concurrent reads.
//
// # What it must not import
//
// api may import only the standard library. It must not import lockd/...
// (nothing of the module): a consumer links no part of the server
// (internal/layers enforces both).
package api
