#!/usr/bin/env escript
%% Erlang/OTP's httpc streaming a response to the calling process, as the
%% seed's floodtest uses it ({sync, false}, {stream, self}), for
%% tests/clients.rs: `escript httpc_stream.escript <url>`. Prints the body as
%% it arrives; a refusal prints "ERROR: <status> <body>" and exits 1.
%% Debian's erlang-nox (.ci/run installs it).
main([Url]) ->
    {ok, _} = application:ensure_all_started(inets),
    {ok, _Ref} = httpc:request(get, {Url, []}, [], [{sync, false}, {stream, self}, {body_format, binary}]),
    loop().

loop() ->
    receive
        {http, {_Ref, stream_start, _Headers}} -> loop();
        {http, {_Ref, stream, Bin}} -> io:put_chars(Bin), loop();
        {http, {_Ref, stream_end, _Headers}} -> halt(0);
        {http, {_Ref, {error, Why}}} -> io:format("ERROR: - ~p~n", [Why]), halt(1);
        {http, {_Ref, {{_, Status, _}, _Headers, Body}}} ->
            io:format("ERROR: ~p ~s~n", [Status, Body]), halt(1)
    after 60000 -> halt(2)
    end.
