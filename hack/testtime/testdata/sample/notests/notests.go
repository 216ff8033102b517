// Package notests has no test files.
package notests

// One is here so the package has a declaration.
const One = 1
