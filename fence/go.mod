module github.com/lockd-dev/lockd/fence

go 1.26.0
