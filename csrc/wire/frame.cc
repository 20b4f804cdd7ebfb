// wire frame: see frame.h
