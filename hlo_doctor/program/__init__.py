"""What hlo-doctor knows of the user's program, as opposed to the compiled HLO.

The rules judge the HLO; this package knows the user's code: where its files
are on this machine, the meshes and specs it writes, the lines where it places,
constrains and wraps, the run record the runner kept, and how a fix is written
in the program's own framework, variables and axis names. Rules and ``fix``
read the program only through it.
"""
