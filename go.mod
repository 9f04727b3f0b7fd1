module github.com/sluicelm/sluice

go 1.26.0

require golang.org/x/text v0.44.0

require golang.org/x/sys v0.50.0

require github.com/ebitengine/purego v0.11.3
