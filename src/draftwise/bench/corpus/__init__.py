"""The development corpus (`draftwise corpus`): benchmark tasks generated from the source files
installed on a machine, split into dev and test by file (build); where the files are found and
whose they are (sources); the shape of a source file (code); and the edits of the `edit` tasks
(edits)."""
