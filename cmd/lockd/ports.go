package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// The port rule of a cluster member (docs/CLUSTER.md, "Ports"): clients on
// its client port P (--listen; its --peers entry as clients dial it), the
// admin endpoint on P + 1 unless --admin says otherwise, the member link
// on P + --peer-offset, and with --http the HTTP API on P + the offset of
// --http's port from --listen's (the same on every member). Members on one host must therefore leave room:
// client ports one apart put one member's admin endpoint on the next
// one's client port.

// portUse is one port a member listens on.
type portUse struct {
	member int    // index in --peers
	what   string // "client", "admin", "member" or "http"
	host   string // sameHost's form
	port   int
}

// checkPorts reports, as a usage error naming the flags and the ports,
// the first port that two of the cluster's listeners share on one host:
// a member's admin or member port that is another member's client port,
// or admin and member ports of members that collide (one member's
// included: --peer-offset 1 puts its member link on its own admin port).
// Every member's admin endpoint is taken to follow the rule when this
// member's does (--admin not given); an explicit --admin is known only
// for this member, and "" (off) has no port. httpOffset is the HTTP
// API's offset from the client port (0: --http not given), the same on
// every member. peers and offset have passed repl.ClusterConfig.Validate.
func checkPorts(peers []string, self int, listen string, offset int, admin string, adminGiven bool, httpOffset int) error {
	var uses []portUse
	for i, p := range peers {
		host, port, _ := net.SplitHostPort(p)
		client, _ := strconv.Atoi(port)
		if i == self {
			// This member listens at --listen's port, whatever its entry
			// says (a proxy may stand between).
			if _, lp, err := net.SplitHostPort(listen); err == nil {
				if n, err := strconv.Atoi(lp); err == nil && n > 0 {
					client = n
				}
			}
		}
		h := sameHost(host)
		uses = append(uses, portUse{i, "client", h, client}, portUse{i, "member", h, client + offset})
		if httpOffset != 0 {
			uses = append(uses, portUse{i, "http", h, client + httpOffset})
		}
		switch {
		case i == self && adminGiven && admin != "":
			ah, ap, _ := net.SplitHostPort(admin)
			if n, _ := strconv.Atoi(ap); n > 0 {
				if ah == "" || net.ParseIP(ah) != nil && net.ParseIP(ah).IsUnspecified() {
					ah = host // a wildcard binds this member's host too
				}
				uses = append(uses, portUse{i, "admin", sameHost(ah), n})
			}
		case !adminGiven && client < 65535:
			uses = append(uses, portUse{i, "admin", h, client + 1})
		}
	}
	for a := range uses {
		for b := a + 1; b < len(uses); b++ {
			x, y := uses[a], uses[b]
			if x.host != y.host || x.port != y.port || x.what == "client" && y.what == "client" {
				continue // two client ports alike are two equal --peers entries: Validate's
			}
			// The taker is the port a rule derived (admin, member, http),
			// the taken one a client port, else the admin port.
			taker, taken := x, y
			if x.what == "client" || y.what == "member" && x.what == "admin" || y.what == "http" && x.what != "http" {
				taker, taken = y, x
			}
			return usageError{fmt.Sprintf("--peers %s: %s is %s: %s", strings.Join(peers, ","),
				describe(peers, taker, offset, adminGiven, httpOffset), describe(peers, taken, offset, adminGiven, httpOffset),
				portAdvice(taker, taken, adminGiven))}
		}
	}
	return nil
}

// describe words one port use with the rule (and flag) that put it there.
func describe(peers []string, u portUse, offset int, adminGiven bool, httpOffset int) string {
	who := "member " + peers[u.member] + "'s"
	switch u.what {
	case "http":
		return fmt.Sprintf("%s HTTP port %d (client port + %d, --http's offset from --listen)", who, u.port, httpOffset)
	case "client":
		return fmt.Sprintf("%s client port %d", who, u.port)
	case "member":
		return fmt.Sprintf("%s member port %d (client port + --peer-offset %d)", who, u.port, offset)
	}
	if adminGiven {
		return fmt.Sprintf("%s admin port %d (--admin)", who, u.port)
	}
	return fmt.Sprintf("%s admin port %d (client port + 1, the default of --admin)", who, u.port)
}

// portAdvice says what to change.
func portAdvice(taker, taken portUse, adminGiven bool) string {
	switch {
	case taker.what == "http" || taken.what == "http":
		return "give --http a port whose offset from --listen's port (the same on every member) puts no member's HTTP port on another port of the cluster"
	case (taker.what == "admin" || taken.what == "admin") && adminGiven:
		return "give --admin a port that no member's client or member port uses"
	case taker.what == "admin" && taken.what == "member" || taker.what == "member" && taken.what == "admin":
		return "give a --peer-offset other than 1 (the default is 10000), or --admin another port"
	case taker.what == "admin":
		return "members on one host need client ports at least 2 apart — e.g. 7070, 7080, 7090 — or give --admin (or --admin \"\" to turn it off)"
	}
	return "change --peer-offset (the same on every member) or the client ports in --peers so that no member port is another member's client or admin port"
}

// sameHost is the form in which two --peers hosts are compared: as
// written, but for case and localhost, which is 127.0.0.1.
func sameHost(h string) string {
	h = strings.ToLower(strings.Trim(h, "[]"))
	if h == "localhost" {
		return "127.0.0.1"
	}
	return h
}

// ephemeralFile holds Linux's range of local ports for outgoing
// connections (and ":0" listeners).
const ephemeralFile = "/proc/sys/net/ipv4/ip_local_port_range"

// ephemeralRange is the kernel's ephemeral port range: ephemeralFile's
// two numbers, or Linux's default 32768–60999 when it cannot be read (ok
// false: not Linux, or no /proc).
func ephemeralRange(file string) (lo, hi int, ok bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 32768, 60999, false
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		l, err1 := strconv.Atoi(f[0])
		h, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil && 0 < l && l <= h {
			return l, h, true
		}
	}
	return 32768, 60999, false
}

// memberPortWarning is ephemeralWarning for a member listening at listen
// (its member port is listen's port + offset) with the range in
// rangeFile; "" when the range cannot be read (not Linux).
func memberPortWarning(listen string, offset int, rangeFile string) string {
	_, port, err := net.SplitHostPort(listen)
	p, _ := strconv.Atoi(port)
	if err != nil || p <= 0 {
		return "" // port 0: any port, nothing to foresee
	}
	lo, hi, ok := ephemeralRange(rangeFile)
	if !ok {
		return ""
	}
	return ephemeralWarning(p+offset, lo, hi)
}

// ephemeralWarning is the warning a member logs at start when its member
// port (client port + --peer-offset) is in the ephemeral range of [lo,
// hi]: any outgoing connection on the host may be given that port as its
// local port, and while it holds it the member cannot bind it (a restart
// fails with "address already in use"). "" when it is outside.
func ephemeralWarning(memberPort, lo, hi int) string {
	if memberPort < lo || memberPort > hi {
		return ""
	}
	return fmt.Sprintf("the member port %d (client port + --peer-offset) is in the kernel's ephemeral port range %d-%d (%s): an outgoing connection of any program on this host may take it while this member is down, and then it cannot start; choose client ports and --peer-offset that put every member port below %d or above %d, or reserve it (net.ipv4.ip_local_reserved_ports)",
		memberPort, lo, hi, ephemeralFile, lo, hi)
}
