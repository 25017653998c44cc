module distlock.dev/examples

go 1.19

require distlock.dev/distlock v0.0.0

// A checkout of distlock; docs/go.md shows the same for a service of your own.
replace distlock.dev/distlock => ../../bindings/go
