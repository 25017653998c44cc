module distlock.dev/bench

go 1.19

require distlock.dev/distlock v0.0.0

replace distlock.dev/distlock => ../../../bindings/go
