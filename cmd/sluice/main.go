// Command sluice runs Mixture-of-Experts language models whose experts
// stream from disk. See README.md for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name, usage, help string
	run               func(ctx context.Context, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"run", "run [-m DIR] (-p TEXT | --tokens IDS) [-n 128] [sampling flags] [--json]", "generate text from a prompt", cmdRun},
		{"chat", "chat [-m DIR] [-n 512] [sampling flags]", "interactive chat with the model's template", cmdChat},
		{"score", "score [-m DIR] (--tokens IDS | --text-file F) [--json]", "per-position argmax and log-probabilities", cmdScore},
		{"bench", "bench [-m DIR] [--prompt 512] [--gen 128] [--depth D] [--threads N] [--repeat R] [--json]", "median prefill and decode speed", cmdBench},
		{"sweep", "sweep [-m DIR] [--pools 5,10,25,50,100] [--prompt 512] [--gen 128] [--repeat R] [--rounds N] [--json] [--svg FILE]", "bench each expert pool size; table and SVG plot against the physical limit", cmdSweep},
		{"pull", "pull OWNER/NAME[@REVISION] [--include GLOB] [--dir DIR] [--no-pack]", "download a Hugging Face repository and pack it", cmdPull},
		{"pack", "pack [--bits 16|8|4] [--force] SRC DST", "convert a Hugging Face checkpoint to a packed model", cmdPack},
		{"inspect", "inspect DIR", "describe a packed model or checkpoint", cmdInspect},
		{"serve", "serve [-m DIR] [--addr 127.0.0.1:8080] [--memory-gb G] [--max-queue N] [--api-key K]", "OpenAI-compatible HTTP server with a chat page at /", cmdServe},
		{"tokenize", "tokenize [-m DIR] --text T", "print token ids as JSON", cmdTokenize},
		{"synth", "synth --like qwen3.5-35b-a3b|qwen3-30b-a3b|gpt-oss-20b|... [--layers N] [--experts N] [--force] --out DIR", "write a random model of real shapes for streaming benchmarks", cmdSynth},
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "sluice: Mixture-of-Experts inference with experts streamed from disk\n\nusage:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  sluice %-70s %s\n", c.usage, c.help)
	}
	fmt.Fprintln(os.Stderr, "\nWithout -m, run, chat, score, bench, sweep and tokenize use the bundled tiny model; -m OWNER/NAME\npulls a Hugging Face repository on first use.\n`sluice COMMAND -h` lists a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands {
		if c.name == os.Args[1] {
			err := c.run(ctx, os.Args[2:])
			if err != nil {
				if errors.Is(err, errHelp) {
					return
				}
				if errors.Is(err, errUsage) {
					os.Exit(2)
				}
				if errors.Is(err, context.Canceled) {
					fmt.Fprintln(os.Stderr, "\nsluice: interrupted")
					os.Exit(130)
				}
				fmt.Fprintf(os.Stderr, "sluice %s: %v\n", c.name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "sluice: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}
