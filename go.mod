module github.com/lockd-dev/lockd

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/hashicorp/go-hclog v1.6.2
	github.com/hashicorp/raft v1.7.3
	github.com/hashicorp/raft-boltdb/v2 v2.3.1
	github.com/hashicorp/raft-wal v0.4.2
	github.com/klauspost/compress v1.20.4
	github.com/lockd-dev/lockd/client v0.0.0-00010101000000-000000000000
	github.com/lockd-dev/lockd/fence v0.0.0-00010101000000-000000000000
	github.com/lockd-dev/lockd/proto v0.0.0-00010101000000-000000000000
	github.com/panjf2000/gnet/v2 v2.9.7
	github.com/prometheus/client_golang v1.23.2
	github.com/prometheus/client_model v0.6.2
	github.com/prometheus/common v0.67.5
	github.com/spf13/cobra v1.10.2
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v2 v2.4.3
	golang.org/x/sys v0.50.0
)

require (
	github.com/armon/go-metrics v0.4.1 // indirect
	github.com/benbjohnson/immutable v0.4.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/boltdb/bolt v1.3.1 // indirect
	github.com/coreos/etcd v3.3.27+incompatible // indirect
	github.com/coreos/go-systemd v0.0.0-20191104093116-d3cd4ed1dbcf // indirect
	github.com/coreos/pkg v0.0.0-20220810130054-c7d1c02cb6cf // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/fatih/color v1.13.0 // indirect
	github.com/hashicorp/go-immutable-radix v1.3.0 // indirect
	github.com/hashicorp/go-metrics v0.5.4 // indirect
	github.com/hashicorp/go-msgpack/v2 v2.1.2 // indirect
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.12 // indirect
	github.com/mattn/go-isatty v0.0.14 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/panjf2000/ants/v2 v2.11.3 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/rogpeppe/go-internal v1.14.1 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	go.etcd.io/bbolt v1.3.6 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.1 // indirect
	golang.org/x/exp v0.0.0-20220827204233-334a2380cb91 // indirect
	golang.org/x/sync v0.24.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
)

// The client library and the frame codec are modules of their own, so that
// a program importing the client requires neither this module nor the
// server's dependencies; this module builds against the checkout's copies
// (README, "Modules": a release tags proto/vX and client/vX first and
// requires those tags here instead).
replace (
	github.com/lockd-dev/lockd/client => ./client
	github.com/lockd-dev/lockd/fence => ./fence
	github.com/lockd-dev/lockd/proto => ./proto
)
