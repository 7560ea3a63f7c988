// composecheck loads a Compose file the way `docker compose config` does (compose-go, the
// Compose specification's reference loader: schema validation, interpolation, merge of
// YAML anchors and extends, consistency checks such as depends_on naming a service) and
// prints the resolved model, for CI machines that have no Docker Compose plugin.
//
//	go tool composecheck [-profile NAME]... FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
)

type profiles []string

func (p *profiles) String() string     { return strings.Join(*p, ",") }
func (p *profiles) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	var active profiles
	flag.Var(&active, "profile", "activate a profile (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: composecheck [-profile NAME]... FILE")
		os.Exit(2)
	}
	file, err := filepath.Abs(flag.Arg(0))
	if err != nil {
		fail(err)
	}
	opts, err := cli.NewProjectOptions(
		[]string{file},
		cli.WithWorkingDirectory(filepath.Dir(file)),
		cli.WithOsEnv,
		cli.WithProfiles(active),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		fail(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fail(err)
	}
	os.Stdout.Write(out)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compose file invalid:", err)
	os.Exit(1)
}
