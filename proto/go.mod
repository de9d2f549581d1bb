module github.com/lockd-dev/lockd/proto

go 1.26.0
