module distlock.dev/distlock

go 1.19
