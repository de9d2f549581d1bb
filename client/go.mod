module github.com/lockd-dev/lockd/client

go 1.26.0

require (
	github.com/lockd-dev/lockd/fence v0.0.0-00010101000000-000000000000
	github.com/lockd-dev/lockd/proto v0.0.0-00010101000000-000000000000
)

// The repository's other library modules, from this checkout (a release
// requires their tags: README, "Modules").
replace (
	github.com/lockd-dev/lockd/fence => ../fence
	github.com/lockd-dev/lockd/proto => ../proto
)
