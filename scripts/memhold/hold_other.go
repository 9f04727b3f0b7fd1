//go:build !linux

package main

import "errors"

func hold(int64) (func(), error) {
	return nil, errors.New("only Linux is supported")
}
